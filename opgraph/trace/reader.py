"""Finding and streaming Chrome/Kineto trace files: ``.json``, ``.json.gz``, folders of ranks, ``.tar.gz``.

The parser never loads the whole document as one Python object: it reads the file in chunks and
decodes one event at a time with the C JSON scanner (:meth:`json.JSONDecoder.raw_decode`), so memory
stays bounded by the events kept, and a truncated or corrupt file is reported with the event count
reached. Top-level keys other than ``traceEvents`` (``deviceProperties``, ``distributedInfo``, ...) are
collected into :attr:`TraceStream.meta`, whichever side of the events they are written on.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from opgraph.ir.errors import LoadError

CHUNK_CHARS = 1 << 20
"""Characters read per refill (1 Mi)."""
MAX_EVENT_CHARS = 64 << 20
"""A single event larger than this is treated as corrupt input rather than buffered further."""

_TRACE_SUFFIXES = (".json", ".json.gz")
_RANK_RE = re.compile(r"(?:rank|worker)[_\-]?(\d+)", re.IGNORECASE)
_WS = re.compile(r"\s*")
_WS_COMMA = re.compile(r"[\s,]*")


class TraceFormatError(LoadError):
    """A trace file is missing, unreadable, truncated, not JSON, or not a Chrome/Kineto trace."""


class NoTraceEventsError(TraceFormatError):
    """Valid JSON that holds no ``traceEvents`` array."""


@dataclass(frozen=True)
class TraceFile:
    """One trace file to read: its display name, how to open it (decompressed bytes), a rank hint."""

    name: str
    """Path shown in messages (``archive.tar.gz:member`` inside an archive)."""
    opener: Callable[[], IO[bytes]]
    """Opens the raw (possibly gzip-compressed) bytes."""
    rank_hint: int | None = None
    """Rank from the file name (``rank3``, ``worker3``), when it has one."""


def _rank_hint(name: str) -> int | None:
    m = _RANK_RE.search(Path(name).name)
    return int(m.group(1)) if m else None


def _is_trace_name(name: str) -> bool:
    return name.endswith(_TRACE_SUFFIXES) and not Path(name).name.startswith(".")


def discover(path: str | Path) -> list[TraceFile]:
    """The trace files at ``path``: one file, every ``*.json[.gz]`` in a folder, or in a ``.tar[.gz]``."""
    p = Path(path)
    if not p.exists():
        raise TraceFormatError("no such file or directory", where=str(p))
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and _is_trace_name(f.name))
        if not files:
            files = sorted(f for f in p.rglob("*") if f.is_file() and _is_trace_name(f.name))
        if not files:
            raise TraceFormatError(
                "directory holds no trace files (*.json, *.json.gz, *.pt.trace.json)",
                where=str(p),
                hint="point at a torch-profiler trace or a folder of per-rank traces",
            )
        return [TraceFile(str(f), _file_opener(f), _rank_hint(f.name)) for f in files]
    if p.name.endswith((".tar.gz", ".tgz", ".tar")):
        return _tar_members(p)
    return [TraceFile(str(p), _file_opener(p), _rank_hint(p.name))]


def _file_opener(p: Path) -> Callable[[], IO[bytes]]:
    def opener() -> IO[bytes]:
        return open(p, "rb")

    return opener


def _tar_members(p: Path) -> list[TraceFile]:
    try:
        with tarfile.open(p, "r:*") as tar:
            names = sorted(m.name for m in tar.getmembers() if m.isfile() and _is_trace_name(m.name))
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise TraceFormatError(f"unreadable tar archive ({exc})", where=str(p)) from None
    if not names:
        raise TraceFormatError("archive holds no trace files (*.json, *.json.gz)", where=str(p))

    def member_opener(member: str) -> Callable[[], IO[bytes]]:
        def opener() -> IO[bytes]:
            tar = tarfile.open(p, "r:*")  # noqa: SIM115 - closed by the returned _TarMember
            f = tar.extractfile(member)
            if f is None:  # pragma: no cover - filtered to regular files above
                raise TraceFormatError("archive member is not a file", where=f"{p}:{member}")
            return cast(IO[bytes], _TarMember(f, tar))

        return opener

    return [TraceFile(f"{p}:{n}", member_opener(n), _rank_hint(n)) for n in names]


class _TarMember(io.RawIOBase):
    """An archive member that closes its archive when closed."""

    def __init__(self, f: IO[bytes], tar: tarfile.TarFile) -> None:
        super().__init__()
        self._f, self._tar = f, tar

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._f.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        try:
            self._f.close()
            self._tar.close()
        finally:
            super().close()


@dataclass
class TraceStream:
    """Events of one trace file, decoded lazily; :attr:`meta` is complete once iteration ends."""

    file: TraceFile
    meta: dict[str, Any] = field(default_factory=dict)
    """Top-level keys other than ``traceEvents``."""
    events_read: int = 0
    """Events decoded so far."""
    array_format: bool = False
    """The file is a bare JSON array of events (Chrome's other trace form), with no metadata."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        raw = self.file.opener()
        try:
            head = raw.read(2)
            stream: IO[bytes]
            rest = raw
            if head == b"\x1f\x8b":
                raw.close()
                rest = self.file.opener()
                stream = cast(IO[bytes], gzip.GzipFile(fileobj=rest, mode="rb"))
            else:
                stream = cast(IO[bytes], _Prefixed(head, raw))
            text = io.TextIOWrapper(stream, encoding="utf-8", errors="strict")
            yield from _Parser(text, self).run()
        finally:
            raw.close()


class _Prefixed(io.RawIOBase):
    """Bytes already read from a stream, followed by the rest of it."""

    def __init__(self, head: bytes, raw: IO[bytes]) -> None:
        super().__init__()
        self._head, self._raw = head, raw

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._head:
            n = min(len(b), len(self._head))
            b[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        data = self._raw.read(len(b))
        b[: len(data)] = data
        return len(data)


def read_trace(file: TraceFile | str | Path) -> TraceStream:
    """A lazy event stream over one trace file (see :class:`TraceStream`)."""
    if not isinstance(file, TraceFile):
        p = Path(file)
        file = TraceFile(str(p), _file_opener(p), _rank_hint(p.name))
    return TraceStream(file)


class _Parser:
    """Chunked decoder of ``{"...": ..., "traceEvents": [ {...}, ... ], ...}``."""

    def __init__(self, text: IO[str], out: TraceStream) -> None:
        self.text, self.out = text, out
        self.name = out.file.name
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0  # characters dropped from the front of buf
        self.dec = json.JSONDecoder()
        self.no_bulk_until = 0  # absolute character offset before which bulk decoding failed once

    def fail(self, message: str, hint: str | None = None) -> TraceFormatError:
        return TraceFormatError(message, where=self.name, hint=hint)

    def fill(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.text.read(CHUNK_CHARS)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise self.fail(
                f"truncated or corrupt gzip data after {self.out.events_read} events ({exc})",
                hint="the file was cut short; re-copy or re-export the trace",
            ) from None
        except UnicodeDecodeError:
            raise self.fail("not a JSON trace: the file is binary, not UTF-8 text") from None
        except OSError as exc:
            raise self.fail(f"unreadable ({exc})") from None
        if not chunk:
            self.eof = True
            return False
        self.consumed += self.pos
        self.buf = self.buf[self.pos :] + chunk
        self.pos = 0
        return True

    def skip(self, ws: re.Pattern[str] = _WS) -> str:
        """Skip whitespace and return the next character ('' at end of input)."""
        while True:
            self.pos = ws.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return ""

    def value(self, what: str) -> Any:
        while True:
            try:
                obj, end = self.dec.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                at_end = exc.pos >= len(self.buf) - 16 or exc.msg.startswith("Unterminated")
                if at_end and len(self.buf) - self.pos < MAX_EVENT_CHARS and self.fill():
                    continue
                if at_end and self.eof:
                    raise self.fail(
                        f"truncated JSON: the file ends inside {what} after {self.out.events_read} events",
                        hint="the trace was cut short (profiler killed or copy incomplete); partial data is not used",
                    ) from None
                line = self.buf.count("\n", 0, exc.pos)
                raise self.fail(
                    f"not valid JSON in {what}: {exc.msg} (character {self.consumed + exc.pos}, "
                    f"{line} lines into the current chunk)"
                ) from None
            self.pos = end
            return obj

    def run(self) -> Iterator[dict[str, Any]]:
        first = self.skip()
        if first == "":
            raise self.fail("the file is empty")
        if first == "[":
            self.out.array_format = True
            self.pos += 1
            yield from self.events()
            return
        if first != "{":
            raise self.fail(f"not a JSON trace: expected '{{' at the start, found {first!r}")
        self.pos += 1
        found = False
        while True:
            c = self.skip()
            if c == "}":
                break
            if c == "":
                raise self.fail(
                    f"truncated JSON: the file ends inside the top-level object after {self.out.events_read} events"
                )
            if c != '"':
                raise self.fail(f"not valid JSON: expected a key, found {c!r}")
            key = self.value("a top-level key")
            if self.skip() != ":":
                raise self.fail(f"not valid JSON: expected ':' after key {key!r}")
            self.pos += 1
            if key == "traceEvents":
                if self.skip() != "[":
                    raise self.fail("traceEvents is not an array")
                self.pos += 1
                found = True
                yield from self.events()
            else:
                self.skip()
                self.out.meta[str(key)] = self.value(f"the value of {key!r}")
            c = self.skip()
            if c == ",":
                self.pos += 1
            elif c == "}":
                break
            elif c == "":
                raise self.fail(
                    f"truncated JSON: the file ends inside the top-level object after {self.out.events_read} events"
                )
            else:
                raise self.fail(f"not valid JSON: expected ',' or '}}' after {key!r}, found {c!r}")
        if not found:
            keys = ", ".join(sorted(self.out.meta)[:6]) or "none"
            raise NoTraceEventsError(
                f"JSON without a traceEvents array (top-level keys: {keys}); not a Chrome/Kineto trace",
                where=self.name,
                hint="export with torch.profiler's export_chrome_trace or on_trace_ready=tensorboard_trace_handler",
            )

    def events(self) -> Iterator[dict[str, Any]]:
        out = self.out
        loads = json.loads
        while True:
            c = self.skip(_WS_COMMA)
            if c == "]":
                self.pos += 1
                return
            if c == "":
                raise self.fail(
                    f"truncated JSON: the file ends inside traceEvents after {out.events_read} events",
                    hint="the trace was cut short (profiler killed or copy incomplete); partial data is not used",
                )
            if c != "{":
                raise self.fail(f"not valid JSON: traceEvents item {out.events_read} is not an object ({c!r})")
            # Bulk path: decode every complete event in the buffer with one json.loads call. The cut is
            # placed after a '}' that is followed by ',' and '{'; a wrong guess (inside a nested value
            # or a string) cannot parse, so success means the slice held whole events only.
            cut = self._last_boundary() if self.consumed + self.pos >= self.no_bulk_until else -1
            if cut > self.pos:
                try:
                    batch = loads("[" + self.buf[self.pos : cut] + "]")
                except ValueError:
                    batch = None
                    self.no_bulk_until = self.consumed + cut
                if batch is not None:
                    self.pos = cut
                    for obj in batch:
                        if type(obj) is not dict:
                            raise self.fail(f"not valid JSON: traceEvents item {out.events_read} is not an object")
                        out.events_read += 1
                        yield obj
                    continue
            obj = self.value(f"traceEvents item {out.events_read}")
            out.events_read += 1
            yield obj

    def _last_boundary(self) -> int:
        """Index just past the last ``}`` followed by ``,`` and ``{`` in the buffer, or -1."""
        buf = self.buf
        end = len(buf)
        for _ in range(8):
            brace = buf.rfind("{", self.pos, end)
            if brace <= self.pos:
                return -1
            end = brace
            j = brace + 1
            while j < len(buf) and buf[j] in " \t\r\n":
                j += 1
            if j >= len(buf) or buf[j] != '"':
                continue
            i = brace - 1
            while i > self.pos and buf[i] in " \t\r\n":
                i -= 1
            if buf[i] == ",":
                i -= 1
                while i > self.pos and buf[i] in " \t\r\n":
                    i -= 1
                if buf[i] == "}":
                    return i + 1
        return -1
