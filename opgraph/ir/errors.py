"""Typed errors of opgraph: every failure a user can cause is one of these, with a one-line message.

The CLI turns an :class:`OpgraphError` into a single line on stderr and exit code 2; nothing else
reaches the user as a traceback.
"""

from __future__ import annotations


class OpgraphError(Exception):
    """Base of every error opgraph raises on purpose: bad input, an impossible request.

    ``where`` names the file, op or option at fault, ``hint`` says what to do.
    """

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """The error as one line: ``where: message (hint)``."""
        text = " ".join(self.message.split())
        if self.where:
            text = f"{self.where}: {text}"
        if self.hint:
            text = f"{text} ({' '.join(self.hint.split())})"
        return text


class LoadError(OpgraphError):
    """A saved file could not be read: missing, truncated, not JSON, or not of the right type."""


class SchemaVersionError(LoadError):
    """A saved file was written by a different (usually newer) schema version."""


class GraphLintError(OpgraphError):
    """An :class:`~opgraph.ir.OpGraph` breaks a structural rule."""


class DuplicateIdError(GraphLintError):
    """Two ops share one id."""


class DanglingEdgeError(GraphLintError):
    """An edge names an op that is not in the graph."""


class CycleError(GraphLintError):
    """The dependency edges form a cycle, so no schedule exists."""


class RegistryError(OpgraphError):
    """A name registered twice, or looked up and not found."""
