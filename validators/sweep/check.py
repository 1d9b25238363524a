"""How a sweep test judges a replay result: pass, skip with the reason, or fail with the reason."""

from __future__ import annotations

from typing import Any

PASSING = frozenset({"ok", "pass", "passed", "success", "match", "matched"})
"""Statuses that pass the test."""
SKIPPING = frozenset({"skip", "skipped", "unsupported", "oom"})
"""Statuses that skip the test: the config cannot be replayed here (no recipe, deliberately not run,
out of device memory), which is not a wrong result. ``mismatch`` and ``error`` fail."""


def status_of(result: Any) -> str:
    """The status of a replay result as a lower-case string (enums give their value)."""
    status = getattr(result, "status", result)
    return str(getattr(status, "value", status)).lower()


def check_replay(result: Any) -> None:
    """Pass, ``pytest.skip`` or ``pytest.fail`` on a ``validators.replay_op`` result.

    The result's ``reason`` (or ``error``/``message``) is shown when it does not pass.
    """
    import pytest

    status = status_of(result)
    reason = ""
    for attr in ("reason", "error", "message"):
        value = getattr(result, attr, None)
        if value:
            reason = str(value)
            break
    if status in PASSING:
        return
    if status in SKIPPING:
        pytest.skip(f"replay {status}: {reason}" if reason else f"replay {status}")
    pytest.fail(f"replay {status}: {reason}" if reason else f"replay {status}: {result!r}", pytrace=False)
