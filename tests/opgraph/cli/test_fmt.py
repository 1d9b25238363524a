"""``opgraph.fmt``: the one home of number formatting; its doctests are its examples."""

from __future__ import annotations

import doctest

import opgraph.fmt


def test_doctests() -> None:
    result = doctest.testmod(opgraph.fmt)
    assert result.attempted > 0 and result.failed == 0


def test_durations_pick_the_unit_that_reads_best() -> None:
    assert [opgraph.fmt.fmt_us(v) for v in (999.994, 1000.0, 999_999.0, 1e6)] == [
        "999.99 us",
        "1.000 ms",
        "999.999 ms",
        "1.000 s",
    ]
    assert opgraph.fmt.fmt_us_sig(-1500.0) == "-1.5 ms"
    assert opgraph.fmt.fmt_count(2.5e21, "FLOP") == "2.5e+03 EFLOP"
