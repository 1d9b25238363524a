"""``--help`` as users rely on it, independent of how typer/rich draws the screen (whose rendering
changes between typer releases): an outline for goldens, and the names a rendered screen must show."""

from __future__ import annotations

import re
from typing import Any


def _help_command(app: Any, names: tuple[str, ...], prog: str) -> tuple[Any, Any]:
    """The command object of ``prog NAMES...`` and its context, built from ``typer.main.get_command``.

    Duck-typed: typer hands out click's classes or (newer typer) those of its own vendored copy.
    """
    import typer.main

    command: Any = typer.main.get_command(app)
    ctx: Any = command.context_class(command, info_name=prog, **command.context_settings)
    for name in names:
        sub = command.get_command(ctx, name)
        assert sub is not None, f"no command {name!r} under {ctx.command_path!r}"
        command = sub
        ctx = command.context_class(command, info_name=name, parent=ctx, **command.context_settings)
    return command, ctx


def help_outline(app: Any, *names: str, prog: str = "opgraph") -> str:
    """What users rely on in ``prog NAMES... --help``, independent of how typer/rich draws the screen.

    The command path, the first paragraph of its help, every argument (metavar, required, variadic)
    and option (option strings, flag, required, default where the command shows it, help), and for a
    group each subcommand with its help's first paragraph. Hidden commands and parameters are left out.
    """
    command, ctx = _help_command(app, names, prog)
    lines = [f"command: {ctx.command_path}"]
    if command.help:
        lines.append(f"help: {_first_paragraph(command.help)}")
    if getattr(command, "deprecated", False):
        lines.append("deprecated")
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    arguments = [p for p in params if not _is_option(p)]
    options = [p for p in params if _is_option(p)]
    if arguments:
        lines.append("arguments:")
        for param in arguments:
            traits = ["required" if param.required else "optional"]
            if param.nargs == -1:
                traits.append("variadic")
            lines.append(f"  {_argument_name(param)} ({', '.join(traits)}){_param_help(param)}")
    if options:
        lines.append("options:")
        for param in options:
            traits = ["flag" if getattr(param, "is_flag", False) else "value"]
            if param.required:
                traits.append("required")
            if getattr(param, "multiple", False):
                traits.append("repeatable")
            if param.show_default and param.default is not None:
                shown = param.show_default if isinstance(param.show_default, str) else param.default
                traits.append(f"default: {shown}")
            if param.envvar:
                traits.append(f"env: {param.envvar}")
            lines.append(f"  {', '.join(_option_strings(param))} ({'; '.join(traits)}){_param_help(param)}")
    if getattr(command, "commands", None) is not None:
        lines.append("commands:")
        for name, sub in _subcommands(command, ctx):
            short = sub.short_help or _first_paragraph(sub.help or "")
            lines.append(f"  {name}: {short}" if short else f"  {name}")
    return "\n".join(lines) + "\n"


def help_names(app: Any, *names: str, prog: str = "opgraph") -> list[str]:
    """Every name ``prog NAMES... --help`` must show: subcommands, argument metavars, option strings."""
    command, ctx = _help_command(app, names, prog)
    found = [name for name, _ in _subcommands(command, ctx)] if getattr(command, "commands", None) else []
    for param in command.get_params(ctx):
        if not getattr(param, "hidden", False):
            found += _option_strings(param) if _is_option(param) else [_argument_name(param)]
    return found


def assert_help_mentions(output: str, names: list[str]) -> None:
    """Each of ``names`` appears in ``output`` as a whole word (``-h`` is not found inside ``--help``)."""
    assert names
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", output), f"{name!r} not in:\n{output}"


def _subcommands(command: Any, ctx: Any) -> list[tuple[str, Any]]:
    subs = ((name, command.get_command(ctx, name)) for name in sorted(command.list_commands(ctx)))
    return [(name, sub) for name, sub in subs if sub is not None and not sub.hidden]


def _is_option(param: Any) -> bool:
    return bool(param.opts) and str(param.opts[0]).startswith("-")


def _argument_name(param: Any) -> str:
    return str(param.metavar or param.name.upper())


def _option_strings(param: Any) -> list[str]:
    return sorted([*param.opts, *param.secondary_opts], key=lambda s: (s.startswith("--"), s))


def _first_paragraph(text: str) -> str:
    return " ".join(text.strip().split("\n\n")[0].split())


def _param_help(param: Any) -> str:
    text = getattr(param, "help", None)
    return f": {_first_paragraph(text)}" if text else ""
