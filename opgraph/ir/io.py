"""Saving and loading IR files (``.json`` or ``.json.gz``): atomic writes, typed one-line load errors."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Literal, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from opgraph.ir.errors import GraphLintError, LoadError, SchemaVersionError
from opgraph.ir.filekinds import KnownFile, known_file
from opgraph.ir.graph import SCHEMA_VERSION, OpGraph
from opgraph.ir.tensor import FrozenModel
from opgraph.ir.timeline import Timeline

M = TypeVar("M", bound=BaseModel)


@contextmanager
def atomic_write(path: str | Path, mode: str = "wb") -> Iterator[IO[bytes]]:
    """Write to a temporary file beside ``path`` and rename it into place only on success.

    A crash or an exception leaves any previous file at ``path`` untouched and no partial file.
    A ``.gz`` suffix compresses the stream.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6, mtime=0) as gz:
                    yield gz  # type: ignore[misc]
            else:
                yield raw
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; saved files get the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_model(obj: BaseModel, path: str | Path) -> Path:
    """Save any pydantic model as JSON (gzip when the name ends in ``.gz``), atomically."""
    path = Path(path)
    with atomic_write(path) as f:
        f.write(obj.model_dump_json(exclude_defaults=False).encode())
    return path


def read_json_bytes(path: str | Path) -> bytes:
    """The raw JSON bytes of ``path``, gunzipped when gzip-compressed; :class:`LoadError` otherwise."""
    p = Path(path)
    if not p.exists():
        raise LoadError("no such file", where=str(p))
    if p.is_dir():
        raise LoadError("is a directory, expected a file", where=str(p))
    try:
        data = p.read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
    except (EOFError, OSError, zlib.error) as exc:
        raise LoadError(f"truncated or corrupt gzip data ({exc})", where=str(p)) from None
    if not data.strip():
        raise LoadError("file is empty", where=str(p))
    return data


def _format_validation(exc: ValidationError) -> str:
    errs = exc.errors()
    first = errs[0]
    loc = ".".join(str(x) for x in first["loc"]) or "(top level)"
    more = f" (and {len(errs) - 1} more problem{'s' if len(errs) > 2 else ''})" if len(errs) > 1 else ""
    value = first.get("input")
    shown = repr(value) if isinstance(value, (int, float, str, bool)) or value is None else type(value).__name__
    return f"{loc}: {first['msg']} (got {shown[:60]}){more}"


def _article(name: str) -> str:
    """``a Timeline`` / ``an OpGraph``."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


_WHAT_TO_PASS = {
    "OpGraph": "pass a graph saved by `opgraph capture`",
    "Timeline": "pass a timeline saved by `opgraph simulate -o`, `opgraph import` or `opgraph capture --profile`",
}


def _wrong_kind(path: str | Path, data: bytes, raw: object, cls: type[BaseModel]) -> LoadError | None:
    """A :class:`LoadError` saying which kind of file ``path`` is, when it is clearly not a ``cls``."""
    want = _article(cls.__name__)
    hint = _WHAT_TO_PASS.get(cls.__name__)
    got: KnownFile | None = None
    if isinstance(raw, dict):
        got = known_file(raw)
    elif str(path).endswith(".toml"):
        got = KnownFile("a TOML file", "a scenario or a hardware spec")
    else:
        first = data.lstrip().split(b"\n", 1)[0]
        try:
            line = json.loads(first)
        except (json.JSONDecodeError, UnicodeDecodeError):
            line = None
        if isinstance(line, dict):
            got = known_file(line)
            got = got if got is not None and got.json_lines else None
    if got is None or got.model == cls.__name__:
        return None
    return LoadError(f"is {got.description}, not {want}", where=str(path), hint=hint)


def schema_versions(cls: type[BaseModel]) -> tuple[int, ...]:
    """The ``schema_version`` values of ``cls`` files this opgraph reads, oldest first (the values of its
    ``schema_version: Literal[...]`` field); empty for a model without one.

    >>> from opgraph.ir import OpGraph, Timeline
    >>> schema_versions(OpGraph), schema_versions(Timeline)
    ((1, 2), (1,))
    """
    field = cls.model_fields.get("schema_version")
    if field is None:
        return ()
    if get_origin(field.annotation) is Literal:
        return tuple(sorted(v for v in get_args(field.annotation) if type(v) is int))
    return (field.default,) if type(field.default) is int else (SCHEMA_VERSION,)


def check_schema_version(raw: Mapping[str, object], cls: type[BaseModel], where: str) -> None:
    """Raise a one-line error naming ``where`` unless ``raw`` (a file's top-level table, or one record of
    a JSON-lines file) has a ``schema_version`` that ``cls`` reads.

    A newer version is a :class:`SchemaVersionError` that says to upgrade opgraph, an older one that
    says to re-create the file. A table without a ``schema_version`` reads as the oldest version when
    ``cls.reads_unversioned`` (files written before the type had a version, files written by hand);
    otherwise it is refused as too old when it is a ``cls`` by its keys, and as another kind of file
    when not. Nothing is checked for a model without a ``schema_version`` field.

    >>> from opgraph.ir import Timeline
    >>> check_schema_version({"schema_version": 1}, Timeline, "t.json")
    >>> try:
    ...     check_schema_version({"schema_version": 9}, Timeline, "t.json")
    ... except SchemaVersionError as exc:
    ...     print(exc.one_line())
    t.json: schema_version 9 is newer than this opgraph's 1 (upgrade opgraph to read it)
    """
    readable = schema_versions(cls)
    if not readable:
        return
    if "schema_version" not in raw and issubclass(cls, FrozenModel) and cls.reads_unversioned:
        return
    version = raw.get("schema_version")
    if version in readable and not isinstance(version, bool):
        return
    latest = max(readable)
    if version is None:
        known = known_file(raw)
        if known is not None and known.model == cls.__name__:
            raise SchemaVersionError(
                f"{_article(cls.__name__)} file without a schema_version: written by an opgraph older than "
                f"this one's {latest}",
                where=where,
                hint="re-create the file with this opgraph",
            )
    if not isinstance(version, int) or isinstance(version, bool):
        raise LoadError(
            f"not {_article(cls.__name__)} file: schema_version is {version!r}",
            where=where,
            hint="expected a file written by `opgraph` with schema_version " + " or ".join(str(v) for v in readable),
        )
    newer = version > latest
    raise SchemaVersionError(
        f"schema_version {version} is {'newer' if newer else 'older'} than this opgraph's {latest}",
        where=where,
        hint="upgrade opgraph to read it" if newer else "re-create the file with this opgraph",
    )


def load_model(path: str | Path, cls: type[M]) -> M:
    """Load ``cls`` from a JSON file; every failure is a one-line :class:`LoadError`.

    A file of another known kind (a timeline where a graph is expected, a profiler trace, replay
    results, a scenario) is named as such; a ``schema_version`` this opgraph does not read is refused
    by :func:`check_schema_version`.
    """
    data = read_json_bytes(path)
    try:
        raw = json.loads(data)
    except json.JSONDecodeError as exc:
        wrong = _wrong_kind(path, data, None, cls)
        if wrong is not None:
            raise wrong from None
        raise LoadError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}", where=str(path)) from None
    except UnicodeDecodeError:
        raise LoadError("not valid JSON: the file is binary, not UTF-8 text", where=str(path)) from None
    wrong = _wrong_kind(path, data, raw, cls)
    if wrong is not None:
        raise wrong
    if not isinstance(raw, dict):
        got = type(raw).__name__
        raise LoadError(f"expected a JSON object for {_article(cls.__name__)}, got {got}", where=str(path))
    check_schema_version(raw, cls, str(path))
    try:
        return cls.model_validate(raw)
    except ValidationError as exc:
        raise LoadError(_format_validation(exc), where=str(path)) from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise LoadError(f"invalid {cls.__name__}: {exc}", where=str(path)) from None


def save_graph(graph: OpGraph, path: str | Path) -> Path:
    """Save a graph as ``.json`` or ``.json.gz`` atomically."""
    return save_model(graph, path)


def load_graph(path: str | Path, *, lint: bool = True) -> OpGraph:
    """Load and (by default) lint a graph; raises :class:`LoadError` or a lint error naming the file."""
    graph = load_model(path, OpGraph)
    if lint:
        try:
            graph.lint()
        except GraphLintError as exc:
            raise type(exc)(
                exc.message, where=f"{path}: {exc.where}" if exc.where else str(path), hint=exc.hint
            ) from None
    return graph


def save_timeline(timeline: Timeline, path: str | Path) -> Path:
    """Save a timeline as ``.json`` or ``.json.gz`` atomically."""
    return save_model(timeline, path)


def load_timeline(path: str | Path) -> Timeline:
    """Load a timeline saved by opgraph."""
    return load_model(path, Timeline)
