"""Load a timeline saved by opgraph, or import a torch-profiler trace, whichever the file is.

The kind is told from the file's start (its first top-level keys), so a trace is parsed once, streamed,
by the trace importer (:func:`opgraph.trace.load_trace`: ``.json``, ``.json.gz``, a folder of ranks, a
``.tar.gz``), and a bad file gets the importer's one-line message (truncated, not JSON, no events).
"""

from __future__ import annotations

import codecs
import json
import zlib
from enum import Enum
from pathlib import Path

from opgraph.ir import LoadError, Timeline, load_timeline

HEAD_BYTES = 1 << 16
"""Bytes (decompressed) read from a file's start to tell a trace from a saved timeline."""
_ARCHIVES = (".tar.gz", ".tgz", ".tar")
_OPGRAPH_KEYS = frozenset({"schema_version", "source", "spans", "ops", "edges"})
"""Top-level keys of files opgraph saves (a timeline, or a graph passed by mistake)."""
_WHAT_TO_PASS = (
    "pass a timeline saved by opgraph (`simulate -o`, `import -o`, `capture --profile`) or a torch-profiler "
    "trace (.json, .json.gz, a folder of per-rank traces, or a .tar.gz of them)"
)
_NEITHER = "neither an opgraph timeline nor a profiler trace"


class FileKind(str, Enum):
    """What a file given as a timeline is."""

    TIMELINE = "timeline"
    """A file opgraph saved (or another opgraph file, which the timeline loader names)."""
    TRACE = "trace"
    """A torch-profiler (Chrome/Kineto) trace, a folder or an archive of them."""


def _head(p: Path) -> tuple[str, bool]:
    """The first :data:`HEAD_BYTES` of the file, gunzipped, as text, and whether that is all of it. A gzip
    stream cut short gives what it holds (the loader that reads the file says it was cut)."""
    ended = True  # a gzip stream cut short is not all of the file
    try:
        with p.open("rb") as raw:
            data = raw.read(HEAD_BYTES + 1)
            if data[:2] == b"\x1f\x8b":
                gz = zlib.decompressobj(16 + zlib.MAX_WBITS)
                out = b""
                chunk = data
                while chunk and len(out) <= HEAD_BYTES and not gz.eof:
                    out += gz.decompress(chunk, HEAD_BYTES + 1 - len(out))
                    chunk = gz.unconsumed_tail or raw.read(1 << 16)
                data, ended = out, gz.eof
    except zlib.error as exc:
        raise LoadError(
            f"corrupt gzip data ({exc})", where=str(p), hint="the file is damaged; re-copy or re-export it"
        ) from None
    except OSError as exc:
        raise LoadError(f"unreadable ({exc.strerror or exc})", where=str(p)) from None
    whole = len(data) <= HEAD_BYTES and ended
    try:
        # incremental: a character cut at the end of the head is not an error
        text = codecs.getincrementaldecoder("utf-8")().decode(data[:HEAD_BYTES], final=whole)
    except UnicodeDecodeError:
        raise LoadError(
            f"{_NEITHER}: the file is binary, not UTF-8 JSON text", where=str(p), hint=_WHAT_TO_PASS
        ) from None
    return text, whole


def _top_keys(text: str) -> list[str]:
    """The top-level keys of the JSON object that ``text`` begins, as far as ``text`` (and valid JSON) goes;
    reading stops at ``traceEvents``, whose value is the bulk of a trace."""
    dec = json.JSONDecoder()
    ws = " \t\r\n"
    i = len(text) - len(text.lstrip(ws)) + 1  # past the '{'
    keys: list[str] = []
    while True:
        while i < len(text) and text[i] in ws + ",":
            i += 1
        if i >= len(text) or text[i] != '"':
            return keys
        try:
            key, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return keys
        keys.append(key)
        while i < len(text) and text[i] in ws:
            i += 1
        if key == "traceEvents" or i >= len(text) or text[i] != ":":
            return keys
        i += 1
        while i < len(text) and text[i] in ws:
            i += 1
        try:
            _, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return keys


def sniff(path: str | Path) -> FileKind:
    """Whether ``path`` is a profiler trace or an opgraph file, from its name and its start only.

    A folder or a ``.tar[.gz]`` is a trace; a JSON object with a ``traceEvents`` key, or a JSON array of
    events (Chrome's other form), is a trace; one with ``schema_version`` (or another key opgraph writes)
    is an opgraph file. A file too short to tell is one opgraph would have written whole; a long one
    that does not tell in its first 64 KiB is read as a trace (the streamed importer says what it lacks).
    :class:`LoadError` for a file that is neither: empty, binary, not JSON.
    """
    p = Path(path)
    if not p.exists():
        raise LoadError("no such file or directory", where=str(p))
    if p.is_dir() or p.name.endswith(_ARCHIVES):
        return FileKind.TRACE
    if p.suffix == ".toml":
        return FileKind.TIMELINE  # the timeline loader names what it is
    text, whole = _head(p)
    body = text.lstrip(" \t\r\n\ufeff")
    if not body:
        raise LoadError("the file is empty", where=str(p), hint=_WHAT_TO_PASS)
    if body[0] == "[":
        item = body[1:].lstrip(" \t\r\n")
        if not item or item[0] in "{]":
            return FileKind.TRACE
        shown = item.split(",", 1)[0].split("]", 1)[0].strip()[:20]
        raise LoadError(
            f"{_NEITHER}: a JSON array whose first item ({shown}) is not a trace event (an object)",
            where=str(p),
            hint=_WHAT_TO_PASS,
        )
    if body[0] != "{":
        raise LoadError(
            f"{_NEITHER}: not JSON (expected '{{' at the start, found {body[0]!r})", where=str(p), hint=_WHAT_TO_PASS
        )
    keys = _top_keys(body)
    if "traceEvents" in keys:
        return FileKind.TRACE
    if _OPGRAPH_KEYS & set(keys) or whole:
        return FileKind.TIMELINE
    return FileKind.TRACE


def _cut_short(p: Path) -> bool:
    """Whether a file that is not valid JSON ends where its JSON would still go on (it was cut)."""
    from opgraph.ir import read_json_bytes

    text = read_json_bytes(p).decode("utf-8", errors="replace").rstrip()
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        return exc.pos >= len(text) - 1 or exc.msg.startswith("Unterminated")
    return False


def load_any_timeline(path: str | Path) -> Timeline:
    """An opgraph ``Timeline`` file, or a Kineto trace (file, folder or ``.tar.gz``) imported as a measured
    timeline (all ranks, tracks prefixed ``rank<r>/``); every failure is a one-line :class:`LoadError`."""
    p = Path(path)
    if sniff(p) is FileKind.TRACE:
        from opgraph.trace import NoTraceEventsError, load_trace

        try:
            return load_trace(p)
        except NoTraceEventsError as exc:
            raise LoadError(f"{_NEITHER}: {exc.message}", where=exc.where, hint=_WHAT_TO_PASS) from None
    try:
        return load_timeline(p)
    except LoadError as exc:
        if exc.message.startswith("not valid JSON") and _cut_short(p):
            raise LoadError(
                "truncated JSON: the file ends before the timeline does",
                where=str(p),
                hint="it was cut short (a copy or a write that did not finish); re-create it",
            ) from None
        if exc.message.startswith("not a Timeline file: schema_version is None"):
            raise LoadError(
                f"{_NEITHER} (no schema_version, no traceEvents)", where=str(p), hint=_WHAT_TO_PASS
            ) from None
        raise
