"""The command line of the TP benchmark scripts (``tp_run.py``, ``tp_predict.py``): their parser and entry point.

Each script defines ``run(args)`` (the work) and ``parse_args(argv)`` (its options, built on
:func:`parser`); :func:`entry_point` joins the two into the script's ``main(argv)``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Protocol

ParseArgs = Callable[[Iterable[str] | None], argparse.Namespace]
"""A script's ``parse_args(argv)``: ``argv`` without the program name, ``None`` for ``sys.argv``."""


class Main(Protocol):
    """A script's ``main(argv=None)``, returning its exit status."""

    def __call__(self, argv: Iterable[str] | None = None) -> int: ...


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose help is ``doc`` (the script's module docstring), kept as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def entry_point(run: Callable[[argparse.Namespace], object], parse_args: ParseArgs, doc: str) -> Main:
    """The script's ``main(argv=None)``: parse ``argv``, run, exit status 0 (a failure raises; a bad
    option exits 2 from the parser). ``doc`` is its docstring."""

    def main(argv: Iterable[str] | None = None) -> int:
        run(parse_args(argv))
        return 0

    main.__doc__ = doc
    return main
