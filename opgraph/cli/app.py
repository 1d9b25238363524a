"""The Typer application: finds the subcommand modules and runs them with one-line errors."""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError  # typer's own click
from typer.core import TyperGroup

from opgraph.cli import commands
from opgraph.cli.common import add_commands


class OneLineUsageErrors(TyperGroup):
    """The root command group: a usage error (a missing argument, an unknown option or command, a value
    of the wrong type) is one line on stderr and exit code 2, as every other bad input, instead of
    typer's usage line and boxed panel."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """As :meth:`TyperGroup.main`; in standalone mode, errors as ``error: COMMAND: what (see
        'COMMAND -h')``."""
        run = functools.partial(super().main, args, prog_name, complete_var, False, windows_expand_args, **extra)
        if not standalone_mode:
            return run()
        try:
            rv = run()
        except NoArgsIsHelpError as exc:  # the help was printed
            sys.exit(exc.exit_code)
        except ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            where = ctx.command_path if ctx is not None else self.name or "opgraph"
            message = " ".join(exc.format_message().split()).rstrip(".")
            print(f"error: {where}: {message} (see '{where} -h')", file=sys.stderr)
            sys.exit(exc.exit_code)
        except typer.Abort:
            print("error: aborted", file=sys.stderr)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="opgraph",
    cls=OneLineUsageErrors,
    help=(
        "Capture a transformer into a typed operator graph, simulate it on hardware, "
        "and compare the prediction with measured runs."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from opgraph import __version__

        typer.echo(f"opgraph {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """opgraph: how fast will this model run on that hardware, and why?"""
    _wide_help_off_a_terminal()


HELP_WIDTH_OFF_TERMINAL = 160
"""Width of ``--help`` when stdout is not a terminal: wide enough that no option name is cut."""


def _wide_help_off_a_terminal() -> None:
    # Typer lays help out at TERMINAL_WIDTH, else rich's guess (80 columns off a terminal), and cuts
    # option names that do not fit ("--independent-engi…"). Off a terminal, lay it out wide instead,
    # unless a width was set explicitly (TERMINAL_WIDTH, or typer.rich_utils.MAX_WIDTH by a caller).
    import sys

    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None and not sys.stdout.isatty():
        typer.rich_utils.MAX_WIDTH = HELP_WIDTH_OFF_TERMINAL


def _register_all() -> None:
    # Each module under opgraph/cli/commands declares its commands with @command("name"), or adds a
    # command group with register(app); heavy imports stay inside commands.
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(app)
        add_commands(app, module.__name__)


_register_all()


def main() -> None:
    """Entry point of the ``opgraph`` console script."""
    _wide_help_off_a_terminal()
    app()
