"""Reading the measured files the catalog ships (device and host profiles): one versioned JSON loader.

Each file carries a ``format`` name and a ``schema_version``; a missing, truncated, foreign or
other-version file is one :class:`~opgraph.ir.LoadError` line that names it and says what to do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from opgraph.ir import LoadError, SchemaVersionError, read_json_bytes
from opgraph.ir.io import schema_versions

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class FileKind:
    """What a versioned file is and how a user makes a new one."""

    noun: str
    """``device profile``."""
    format: str
    """The ``format`` value the file must carry."""
    version: int
    """The ``schema_version`` this opgraph reads."""
    made_by: str
    """The command that writes one (``opgraph profile``), for hints."""
    remake: str
    """The hint for an older or unreadable file."""

    def check(self, raw: dict[str, object], where: str, readable: tuple[int, ...] = ()) -> None:
        """Raise a one-line :class:`~opgraph.ir.LoadError` unless ``raw`` is of this kind and of a version
        in ``readable`` (default: :attr:`version` alone)."""
        if raw.get("format") != self.format:
            raise LoadError(
                f"not a {self.noun} (format is {raw.get('format')!r}, expected {self.format!r})",
                where=where,
                hint=f"give a file written by `{self.made_by}`",
            )
        version = raw.get("schema_version")
        if isinstance(version, bool) or version not in (readable or (self.version,)):
            if not isinstance(version, int) or isinstance(version, bool):
                raise LoadError(f"{self.noun} with a bad schema_version {version!r}", where=where)
            newer = version > self.version
            raise SchemaVersionError(
                f"{self.noun} schema_version {version} is {'newer' if newer else 'older'} than this opgraph's "
                f"{self.version}",
                where=where,
                hint="upgrade opgraph to read it" if newer else self.remake,
            )

    def load(self, path: str | Path, cls: type[M], *, unreadable_hint: str | None = None) -> M:
        """Read and validate a file of this kind as ``cls`` (the versions its ``schema_version: Literal[...]``
        names, :func:`opgraph.ir.io.schema_versions`); every failure is one line naming the file."""
        where = str(path)
        data = read_json_bytes(path)
        try:
            raw = json.loads(data)
        except json.JSONDecodeError as exc:
            raise LoadError(
                f"truncated or not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                where=where,
                hint=unreadable_hint or self.remake,
            ) from None
        except UnicodeDecodeError:
            raise LoadError("not valid JSON: the file is binary, not UTF-8 text", where=where) from None
        if not isinstance(raw, dict):
            raise LoadError(f"expected a JSON object for a {self.noun}, got {type(raw).__name__}", where=where)
        self.check(raw, where, schema_versions(cls))
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            raise LoadError(f"invalid {self.noun}: {loc}: {err['msg']}", where=where) from None
