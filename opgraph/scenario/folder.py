"""A run's output folder, written whole or not at all.

A run writes into a fresh hidden sibling folder (``.<name>.partial-XXXX``) and, once every artefact
and ``summary.json`` are written, swaps it in place of the output folder. An interrupted or failed
run removes its partial folder and leaves an earlier run's folder exactly as it was, so a folder
never holds a ``summary.json`` that claims a result the files beside it do not come from.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from opgraph.scenario.model import ScenarioError

SUMMARY_FILE = "summary.json"
"""The file that marks a folder as a run's output."""


def check_run_folder(out: Path) -> None:
    """Refuse an output folder a run must not replace: a file, the current folder, or a folder of other files.

    A run replaces the whole folder, so it only takes a new folder, an empty one, or one an earlier
    run wrote (it holds ``summary.json``).
    """
    if out.exists() and not out.is_dir():
        raise ScenarioError(f"{out} is a file, not a folder", where="output", hint="give a folder for the run")
    resolved = out.resolve()
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise ScenarioError(
            f"{out} is the current folder (or holds it); a run replaces its output folder as a whole",
            where="output",
            hint="give a folder of its own, e.g. out/NAME",
        )
    if out.is_dir() and any(out.iterdir()) and not (out / SUMMARY_FILE).is_file():
        raise ScenarioError(
            f"{out} holds files that are not an earlier run's (no {SUMMARY_FILE}); a run replaces its output folder",
            where="output",
            hint="give a new or empty folder, or remove this one",
        )


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Yield a fresh partial folder beside ``out``; swap it in place of ``out`` when the block succeeds.

    On any exception (including Ctrl-C) the partial folder is removed and ``out`` is untouched.
    """
    check_run_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _swap(partial, out)


def _swap(partial: Path, out: Path) -> None:
    """Put ``partial`` where ``out`` is: move an earlier ``out`` aside, rename, then delete the earlier one."""
    old: Path | None = None
    if out.exists():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.old-"))
        old.rmdir()
        out.rename(old)
    try:
        partial.rename(out)
    except BaseException:
        if old is not None:
            old.rename(out)
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
