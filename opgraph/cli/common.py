"""Helpers shared by subcommands: declaring one, consoles, tables, one-line errors, output paths, number formatting.

Output never depends on the terminal when it is not one: piped or redirected output (and test
runners) get whole lines, never wrapped, folded or cropped with ``…``, whatever ``COLUMNS`` says.
On a terminal, rich lays out tables to the window and folds long cells rather than cropping them.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import typer
from rich.console import Console, ConsoleDimensions
from rich.table import Column, Table

from opgraph.fmt import fmt_bytes, fmt_count, fmt_us
from opgraph.ir.errors import OpgraphError, RegistryError

__all__ = [
    "KindsOption",
    "OutputPathError",
    "add_commands",
    "check_output_path",
    "cli_notes",
    "command",
    "console",
    "err_console",
    "fail",
    "fmt_bytes",
    "fmt_count",
    "fmt_us",
    "handle_errors",
    "is_tty",
    "new_table",
    "parse_kinds",
]

P = ParamSpec("P")
R = TypeVar("R")

UNBOUNDED_WIDTH = 1_000_000
"""Width rich lays out to when the output is not a terminal: wide enough that nothing wraps."""


def is_tty(stream: Any) -> bool:
    """Whether ``stream`` really is a terminal (not what FORCE_COLOR / TTY_COMPATIBLE claim)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):
        return False


class CliConsole(Console):
    """A rich console whose width is the terminal's on a terminal, and unbounded otherwise.

    rich defaults to 80 columns (or ``COLUMNS``) when the output is a pipe or a file, and then wraps
    lines and crops table cells: output would depend on the environment. Here a non-terminal gets
    an unbounded width, so every line and cell comes out whole.
    """

    @property
    def size(self) -> ConsoleDimensions:
        """The terminal's size on a terminal; an unbounded width otherwise."""
        dims = super().size
        if is_tty(self.file):
            return dims
        return ConsoleDimensions(UNBOUNDED_WIDTH, dims.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        width, height = new_size
        self._width = width
        self._height = height

    def on_broken_pipe(self) -> None:
        """The reader closed the output: drop what is buffered and let :func:`handle_errors` end quietly.

        (rich's own handler exits with status 1 and assumes a real stdout file descriptor.)
        """
        del self._buffer[:]
        raise BrokenPipeError(errno.EPIPE, "the reader closed the output")


console = CliConsole(highlight=False, soft_wrap=False)
"""Standard output console for tables and summaries."""


def err_console() -> Console:
    """A console on the current stderr (looked up per call so test runners can capture it)."""
    return CliConsole(file=sys.stderr, highlight=False, soft_wrap=True)


class CliTable(Table):
    """A rich table whose columns fold long cells on a narrow terminal instead of cropping them with ``…``."""

    def add_column(self, header: Any = "", *args: Any, **kwargs: Any) -> None:
        """As :meth:`rich.table.Table.add_column`, with ``overflow="fold"`` unless given."""
        kwargs.setdefault("overflow", "fold")
        super().add_column(header, *args, **kwargs)


def new_table(*headers: str | Column, **kwargs: Any) -> Table:
    """A :class:`CliTable` (see there): long names fold on a narrow terminal and are never cropped."""
    table = CliTable(**kwargs)
    for header in headers:
        if isinstance(header, Column):
            table.columns.append(header)
        else:
            table.add_column(header)
    return table


_LIBRARY_ONLY_NOTES = {
    "(the Python API's opgraph.trace.load_trace_data(path, python=True) keeps them)": (
        "(the CLI leaves Python stack events out)"
    ),
}
"""Library notes that name a keyword argument the CLI has no flag for, and what the CLI says instead."""


def cli_notes(notes: Iterable[str]) -> tuple[str, ...]:
    """Library notes as the CLI shows them: no advice about keyword arguments the CLI does not have."""
    out = []
    for note in notes:
        for library, cli in _LIBRARY_ONLY_NOTES.items():
            note = note.replace(library, cli)
        out.append(note)
    return tuple(out)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``error: message`` on stderr as one line and return the Exit to raise."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    return typer.Exit(code)


class OutputPathError(OpgraphError):
    """An output path cannot be written (missing folder, a folder, not writable, or one of the inputs)."""


def check_output_path(
    path: Path | str | None,
    option: str,
    *,
    inputs: Iterable[Path | str | None] = (),
    folder: bool = False,
) -> None:
    """Fail early (before any long work) when ``path`` cannot be written by the command.

    Checks that the nearest existing folder above ``path`` accepts new files (missing folders are
    created when writing), that ``path`` is not a folder (or, with ``folder=True``, not a file),
    that an existing file is writable, and that ``path`` is not one of the command's ``inputs``
    (compared as resolved paths). ``option`` names the flag in the
    message. ``None`` (no output asked for) passes.
    """
    if path is None:
        return
    out = Path(path)
    if folder:
        if out.exists() and not out.is_dir():
            raise OutputPathError(
                f"{out} is a file, not a folder", where=option, hint="give a folder (new or from an earlier run)"
            )
    elif out.is_dir():
        raise OutputPathError(f"{out} is a folder", where=option, hint="give a file name")
    resolved = out.resolve()
    for inp in inputs:
        if inp is not None and Path(inp).resolve() == resolved:
            raise OutputPathError(
                f"{out} is also an input of this command and would be overwritten",
                where=option,
                hint="write to another file",
            )
    parent = resolved.parent
    while not parent.exists() and parent != parent.parent:  # missing folders are created: check the nearest
        parent = parent.parent
    if not parent.is_dir():
        raise OutputPathError(f"{parent} is not a folder", where=option, hint="write elsewhere")
    if out.exists() and not out.is_dir() and not os.access(out, os.W_OK):
        raise OutputPathError(f"{out} is not writable", where=option, hint="write elsewhere")
    try:  # os.access says yes to root everywhere (even /proc): create and delete a probe file instead
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".opgraph-probe-"):
            pass
    except OSError as exc:
        raise OutputPathError(
            f"cannot write in folder {parent} ({exc.strerror or exc})", where=option, hint="write elsewhere"
        ) from None


def _silence_stdout() -> None:
    """After a closed pipe on stdout: point stdout at /dev/null so the final flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def handle_errors(func: Callable[P, R]) -> Callable[P, R]:
    """Turn :class:`OpgraphError` into one stderr line and exit 2; Ctrl-C into exit 130.

    A reader that closed stdout early (``| head``) ends the command quietly with exit 0, as it would
    for any Unix tool. Unexpected exceptions print one line too, unless ``OPGRAPH_DEBUG=1`` asks for
    the traceback.
    """

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except OpgraphError as exc:
            raise fail(exc.one_line()) from None
        except KeyboardInterrupt:
            raise fail("interrupted", code=130) from None
        except BrokenPipeError:
            _silence_stdout()
            raise typer.Exit(0) from None
        except Exception as exc:
            if os.environ.get("OPGRAPH_DEBUG"):
                raise
            raise fail(
                f"internal error {type(exc).__name__}: {exc} (set OPGRAPH_DEBUG=1 for the traceback and report it)",
                code=1,
            ) from None

    return wrapper


_COMMANDS: dict[str, tuple[str, Callable[..., Any]]] = {}
"""Subcommand name -> (the module that declares it, the command function), in declaration order."""


def command(name: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Declare the decorated function as the subcommand ``name``, its errors as one line (:func:`handle_errors`).

    :func:`add_commands` adds it to the app (:mod:`opgraph.cli.app` does, for every module of
    :mod:`opgraph.cli.commands`); a name declared twice raises :class:`~opgraph.ir.RegistryError`.
    """

    def declare(func: Callable[P, R]) -> Callable[P, R]:
        if name in _COMMANDS:
            raise RegistryError(f"command {name!r} is already registered")
        wrapped = handle_errors(func)
        _COMMANDS[name] = (func.__module__, wrapped)
        return wrapped

    return declare


def add_commands(app: typer.Typer, module: str) -> None:
    """Add the subcommands that ``module`` declared with :func:`command` to ``app``, in declaration order."""
    for name, (declared_in, func) in _COMMANDS.items():
        if declared_in == module:
            app.command(name)(func)


KindsOption = Annotated[str, typer.Option("--kinds", help="Only these op kinds, comma-separated (gemm,attention,...).")]
"""The ``--kinds`` option of the commands that measure ops (``replay``, ``profile``): read by :func:`parse_kinds`."""


def parse_kinds(text: str) -> list[str]:
    """The op kinds a ``--kinds`` value names, in its order; an unknown kind is an error naming the known ones."""
    from opgraph.ir import OpKind

    wanted = [k.strip() for k in text.split(",") if k.strip()]
    valid = {k.value for k in OpKind}
    bad = [k for k in wanted if k not in valid]
    if bad:
        raise OpgraphError(f"unknown op kind {bad[0]!r}", where="--kinds", hint=f"known: {', '.join(sorted(valid))}")
    return wanted
