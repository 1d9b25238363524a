"""A profiled capture's measured timeline holds together: its device time is at most its own wall.

QA found a CPU validation whose reference had a device time of 7,892 us and a wall of 1,213 us: the
op spans came from the profiled run (the profiler's and recorder's overhead in every span) and the
wall from the plain runs. On the CPU the timeline's wall is now the profiled run's own, and a note
gives the plain runs' wall.
"""

from __future__ import annotations

import pytest

from opgraph.compare import cpu_device_view

pytest.importorskip("torch")


def test_a_cpu_profile_has_its_device_time_within_its_own_wall(tiny_config: str) -> None:
    from opgraph.capture import profile_capture

    result = profile_capture(tiny_config, seq_len=8, device="cpu", wall_repeats=3)
    tl = result.timeline
    assert tl.wall_us == result.wall_profiled_us  # the wall of the run the spans come from
    device_us = sum(s.dur_us for s in cpu_device_view(tl).spans)  # each op's CPU ops, nested ones once
    assert 0 < device_us <= tl.wall_us
    # the plain runs' wall is not lost: a note states it and says why the spans are not it
    note = next(n for n in tl.notes if "plain run" in n)
    assert f"{result.wall_us:.1f} us" in note and "overhead" in note
    assert result.wall_us == sorted(result.wall_runs_us)[1]
