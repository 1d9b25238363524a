"""A run's output folder, written whole or not at all, and never a folder of the user's own files.

A run writes into a fresh hidden sibling folder (``.<name>.partial-XXXX``) and, once every artefact
and ``summary.json`` are written, swaps it in place of the output folder. An interrupted or failed
run removes its partial folder and leaves an earlier run's folder exactly as it was, so a folder
never holds a ``summary.json`` that claims a result the files beside it do not come from.

A run replaces only a new folder, an empty one, or one an earlier run wrote: its ``summary.json``
parses as the summary of ``opgraph run`` (:class:`~opgraph.scenario.ScenarioSummary`) or of
``opgraph validate`` (:class:`~opgraph.scenario.validation.ValidationSummary``), and every file in
the folder is one that summary lists. Even then only those files are deleted: anything else that
turns up in the folder while the run works is kept.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from opgraph.scenario.model import ScenarioError

SUMMARY_FILE = "summary.json"
"""The file that marks a folder as a run's output."""

_HINT = "give a new or empty folder, or remove this one"


def summary_files(summary_json: bytes | str) -> frozenset[str] | None:
    """The files a run wrote into its folder, from its ``summary.json`` text; None when it is not such a summary.

    >>> summary_files('{"name": "not ours"}') is None
    True
    """
    from opgraph.scenario.result import ScenarioSummary
    from opgraph.scenario.validation import ValidationSummary

    try:
        raw = json.loads(summary_json)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(raw, dict):
        return None
    try:
        return frozenset({SUMMARY_FILE, *ScenarioSummary.model_validate(raw).artefacts})
    except (ValidationError, ValueError, TypeError):
        pass
    try:
        return ValidationSummary.model_validate(raw).files
    except (ValidationError, ValueError, TypeError):
        return None


def _not_a_run_folder(out: Path, why: str) -> ScenarioError:
    """The one-line refusal of an output folder that is not an earlier run's: ``out``, ``why``, what to do."""
    return ScenarioError(f"{out} {why}; a run replaces its output folder", where="output", hint=_HINT)


def _folder_files(out: Path) -> tuple[list[str], list[str]]:
    """``(files, others)`` under ``out``: regular files as relative POSIX names, and anything else (links, ...)."""
    files: list[str] = []
    others: list[str] = []
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_symlink():
            others.append(rel)
        elif path.is_file():
            files.append(rel)
        elif not path.is_dir():
            others.append(rel)
    return files, others


def earlier_run_files(out: Path) -> frozenset[str]:
    """The files of the earlier run in ``out``, which a new run may delete; empty for a new or empty folder.

    Raises :class:`ScenarioError` (one line: the folder, why, what to do) unless ``out`` is an
    earlier run's folder: its ``summary.json`` is one this tool writes and every file beside it is
    one that summary lists.
    """
    if not out.is_dir() or not any(out.iterdir()):
        return frozenset()
    summary = out / SUMMARY_FILE
    if summary.is_symlink() or not summary.is_file():
        raise _not_a_run_folder(out, f"holds files that are not an earlier run's (no {SUMMARY_FILE})")
    try:
        text = summary.read_bytes()
    except OSError as exc:
        raise _not_a_run_folder(out, f"holds a {SUMMARY_FILE} that cannot be read ({exc.strerror})") from None
    written = summary_files(text)
    if written is None:
        raise _not_a_run_folder(
            out,
            f"holds files that are not an earlier run's (its {SUMMARY_FILE} is not one `opgraph run` or "
            "`opgraph validate` writes)",
        )
    files, others = _folder_files(out)
    foreign = others + [f for f in files if f not in written]
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise _not_a_run_folder(
            out,
            f"holds files that are not an earlier run's ({foreign[0]}{more}: not among the files its "
            f"{SUMMARY_FILE} lists)",
        )
    return frozenset(files)


def check_run_folder(out: Path) -> None:
    """Refuse an output folder a run must not replace: a file, the current folder, or a folder of other files.

    A run replaces the whole folder, so it only takes a new folder, an empty one, or one an earlier
    run wrote (see :func:`earlier_run_files`).
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
    if out.is_symlink():
        raise ScenarioError(
            f"{out} is a link; a run replaces its output folder as a whole",
            where="output",
            hint="give the folder itself, or a new one",
        )
    earlier_run_files(out)


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """Yield a fresh partial folder beside ``out``; swap it in place of ``out`` when the block succeeds.

    On any exception (including Ctrl-C) the partial folder is removed and ``out`` is untouched.
    ``out`` is checked again right before the swap (the block may run for minutes): if it no longer
    holds only an earlier run's files, the new run is dropped with the one-line error instead.
    """
    check_run_folder(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.partial-"))
    try:
        yield partial
        check_run_folder(out)
        earlier = earlier_run_files(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    _swap(partial, out, earlier)


def _swap(partial: Path, out: Path, earlier: frozenset[str]) -> None:
    """Put ``partial`` where ``out`` is: move an earlier ``out`` aside, rename, then delete the earlier run's files.

    Only the files in ``earlier`` are deleted; anything else found in the earlier folder (written
    into it since it was checked) stays in the hidden ``.<name>.old-XXXX`` folder beside ``out``,
    with a warning that names it.
    """
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
        _remove_earlier(old, earlier)


def _remove_earlier(old: Path, earlier: frozenset[str]) -> None:
    """Delete the earlier run's files from ``old`` and ``old`` itself once empty; warn about what is left."""
    for name in earlier:
        path = old / name
        if path.is_file() and not path.is_symlink():
            path.unlink()
    for folder in sorted((p for p in old.rglob("*") if p.is_dir() and not p.is_symlink()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only empty ones
    try:
        old.rmdir()
    except OSError:
        warnings.warn(
            f"files that appeared in the output folder during the run are kept in {old}", RuntimeWarning, stacklevel=3
        )
