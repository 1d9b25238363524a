"""Helpers shared by subcommands: declaring one, consoles, tables, one-line errors, output paths, number formatting.

Output never depends on the terminal when it is not one: piped or redirected output (and test
runners) get whole lines, never wrapped, folded or cropped with ``…``, whatever ``COLUMNS`` says.
On a terminal, tables fit the window: long names fold rather than being cropped, numbers stay whole
(:class:`CliTable`).
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
from rich.console import Console, ConsoleDimensions, ConsoleOptions, RenderResult
from rich.table import Column, Table
from rich.text import Text

from opgraph.fmt import fmt_bytes, fmt_count, fmt_us
from opgraph.ir.errors import OpgraphError, RegistryError

__all__ = [
    "HostTimeError",
    "KindsOption",
    "OutputPathError",
    "add_commands",
    "check_distinct_outputs",
    "check_host_time",
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
    "print_notes",
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


FOLD_WORD = 16
"""A word longer than this may fold in a text column on a narrow terminal (kernel names, paths); numbers
(cells of right-justified columns) never fold."""


class CliTable(Table):
    """A rich table for a terminal of any width: long names fold instead of being cropped with ``…``, and
    numbers stay whole (rich alone would fold ``12,687.9`` into ``12,6`` and ``87.9``).

    A table of three or more columns that does not fit the window with its numbers whole and its words
    up to :data:`FOLD_WORD` characters whole is drawn without borders and with one space between
    columns; when even that does not fit, as records: one block per row, a line per column
    (``header  value``)."""

    def add_column(self, header: Any = "", *args: Any, **kwargs: Any) -> None:
        """As :meth:`rich.table.Table.add_column`, with ``overflow="fold"`` unless given."""
        kwargs.setdefault("overflow", "fold")
        super().add_column(header, *args, **kwargs)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if len(self.columns) < 3:
            yield from super().__rich_console__(console, options)
            return
        widths = self._widths(console, options)
        saved = self.box, self.show_edge, self.padding, self.pad_edge
        if widths is None:  # narrower: no borders, one space between columns
            self.box, self.show_edge, self.padding, self.pad_edge = None, False, (0, 1, 0, 0), False
            widths = self._widths(console, options)
        try:
            if widths is None:
                yield from self._records(console, options)
                return
            fixed = [column.width for column in self.columns]
            for column, width in zip(self.columns, widths, strict=True):
                column.width = width - self._get_padding_width(column._index)
            try:
                yield from super().__rich_console__(console, options)
            finally:
                for column, was in zip(self.columns, fixed, strict=True):
                    column.width = was
        finally:
            self.box, self.show_edge, self.padding, self.pad_edge = saved

    def _widths(self, console: Console, options: ConsoleOptions) -> list[int] | None:
        """Column widths (padding included) that keep numbers whole and words up to :data:`FOLD_WORD`
        whole within the window, the room left shared in proportion to what more each column would
        take; ``None`` when they cannot fit."""
        room = options.max_width - self._extra_width
        most = [self._measure_column(console, options, column).maximum for column in self.columns]
        least = [min(m, self._least(console, column)) for m, column in zip(most, self.columns, strict=True)]
        if sum(least) > room:
            return None
        if sum(most) <= room:
            return most
        wants = [m - low for m, low in zip(most, least, strict=True)]
        spare = room - sum(least)
        widths = [low + spare * want // sum(wants) for low, want in zip(least, wants, strict=True)]
        for i in sorted(range(len(widths)), key=lambda i: most[i] - widths[i], reverse=True):
            if sum(widths) >= room:
                break
            widths[i] += widths[i] < most[i]
        return widths

    def _least(self, console: Console, column: Column) -> int:
        """The narrowest ``column`` may be (padding included): its header's longest word, and each cell
        whole in a right-justified (number) column, else each cell's longest word up to :data:`FOLD_WORD`."""
        words = [len(w) for w in _plain(console, column.header).split()]
        for cell in column._cells:
            text = _plain(console, cell)
            if column.justify == "right":
                words.append(len(text))
            else:
                words.extend(min(len(w), FOLD_WORD) for w in text.split())
        return max(words, default=1) + self._get_padding_width(column._index)

    def _records(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """One block per row, a line per non-empty cell (``header  value``)."""
        if self.title:
            yield console.render_str(self.title, style="table.title") if isinstance(self.title, str) else self.title
        rows = [[column._cells[i] for column in self.columns] for i in range(self.row_count)]
        if self.show_footer:
            rows.append([column.footer for column in self.columns])
        last_first: Any = ""
        for i, cells in enumerate(rows):
            # A row that leaves its first cell empty continues the group the row above named.
            if _plain(console, cells[0]):
                last_first = cells[0]
            else:
                cells = [last_first, *cells[1:]]
            record = Table.grid(padding=(0, 1))
            record.add_column(style="bold", overflow="fold", max_width=max(8, options.max_width // 2))
            record.add_column(overflow="fold")
            for column, cell in zip(self.columns, cells, strict=True):
                if _plain(console, cell):
                    record.add_row(column.header, cell)
            if i:
                yield ""
            yield record


def _plain(console: Console, cell: Any) -> str:
    """The text of a table cell (markup rendered), stripped; empty for a cell without text."""
    if isinstance(cell, str):
        return console.render_str(cell).plain.strip()
    return cell.plain.strip() if isinstance(cell, Text) else ("-" if cell is not None else "")


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


def print_notes(notes: Iterable[str]) -> None:
    """Print each note as ``note: ...``, as text: notes quote model, kernel and scope names, whose
    brackets are no console markup."""
    for note in notes:
        console.print(f"note: {note}", markup=False)


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


def check_distinct_outputs(outputs: list[tuple[Path | None, str]]) -> None:
    """One error line when two of a command's outputs (path, option) are the same file: the second
    would overwrite the first."""
    seen: dict[Path, str] = {}
    for path, option in outputs:
        if path is None:
            continue
        first = seen.setdefault(path.resolve(), option)
        if first != option:
            raise OutputPathError(
                f"{path} is also the {first} file of this command",
                where=option,
                hint="write each output to its own file",
            )


class HostTimeError(OpgraphError):
    """A host time per op given with host mode ``none``, which has no host to spend it."""


def check_host_time(host_mode: str, host_us: float | None, where: str = "--host-us") -> None:
    """Refuse ``--host-us`` above 0 with host mode ``none`` as one error line naming ``where`` (``simulate``,
    ``serve-sim``), before the command builds its settings.

    The rule and its message are :func:`simulators.host_time_conflict`'s, which
    :class:`simulators.HostConfig` enforces, so the command line, ``--config`` files, scenario files
    and the Python API refuse the same thing with the same words. ``host_mode`` is the mode the run
    gets (from ``--host``, or the ``--config`` file when the flag is not given), ``host_us`` the
    ``--host-us`` given (``None``: not given); ``where`` names the option, and the file the mode came
    from. A time of 0 agrees with no host and passes.
    """
    from simulators import host_time_conflict

    conflict = host_time_conflict(host_mode, host_us)
    if conflict is not None:
        hint = "drop --host-us, or give --host eager or --host cuda-graph with it"
        raise HostTimeError(conflict, where=where, hint=hint)


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
