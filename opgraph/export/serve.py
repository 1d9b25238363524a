"""``--open``: serve one trace file once on the loopback address and open it in ui.perfetto.dev.

This is what Perfetto's own ``open_trace_in_ui`` script does: a one-file HTTP server on
``127.0.0.1:9001`` (a port the Perfetto UI's content security policy allows) that answers with the
``Access-Control-Allow-Origin`` header for ``https://ui.perfetto.dev``, and a browser pointed at
``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/<file>``. The server stops as soon as the
file has been sent once, or after ``timeout_s``. It never listens on anything but 127.0.0.1.
"""

from __future__ import annotations

import http.server
import sys
import time
import urllib.parse
import webbrowser
from collections.abc import Callable
from pathlib import Path

from opgraph.export.common import ExportError, ServeTimeoutError

PERFETTO_ORIGIN = "https://ui.perfetto.dev"
"""The only origin allowed to read the served trace."""

LOOPBACK = "127.0.0.1"
"""The only address the server binds."""

DEFAULT_PORT = 9001
"""Perfetto UI accepts trace URLs on 127.0.0.1:9001 (its content security policy names this port)."""

DEFAULT_TIMEOUT_S = 120.0
"""How long to wait for the browser to fetch the trace."""


def perfetto_url(filename: str, port: int = DEFAULT_PORT) -> str:
    """The ui.perfetto.dev address that makes the UI fetch ``filename`` from the local server."""
    quoted = urllib.parse.quote(filename)
    return f"{PERFETTO_ORIGIN}/#!/?url=http://{LOOPBACK}:{port}/{quoted}"


class _OneFileServer(http.server.HTTPServer):
    def __init__(self, port: int, path: Path) -> None:
        self.trace_path = path
        self.url_path = "/" + urllib.parse.quote(path.name)
        self.served = False
        super().__init__((LOOPBACK, port), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _OneFileServer
    protocol_version = "HTTP/1.1"

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", PERFETTO_ORIGIN)
        self.send_header("Access-Control-Allow-Methods", "GET, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "*")
        self.send_header("Cache-Control", "no-cache")

    def do_OPTIONS(self) -> None:
        self.send_response(204)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != self.server.url_path:
            self.send_response(404)
            self._cors()
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        size = self.server.trace_path.stat().st_size
        self.send_response(200)
        self._cors()
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        with self.server.trace_path.open("rb") as f:
            while chunk := f.read(1 << 20):
                self.wfile.write(chunk)
        self.server.served = True

    def log_message(self, format: str, *args: object) -> None:  # quiet: the CLI prints its own line
        return


def _notify_stderr(message: str) -> None:
    print(message, file=sys.stderr)


def open_in_perfetto(
    path: str | Path,
    *,
    port: int = DEFAULT_PORT,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    opener: Callable[[str], object] | None = None,
    notify: Callable[[str], None] | None = None,
) -> bool:
    """Serve ``path`` once on ``127.0.0.1:port`` and open it in ui.perfetto.dev; return once it was fetched.

    ``opener`` opens the URL (default: :func:`webbrowser.open`) and returns ``False`` when no browser
    could be opened (as :func:`webbrowser.open` does on a machine without one): then the URL and the
    file are told through ``notify`` and the call returns ``False`` at once instead of waiting for a
    fetch that cannot come. ``notify`` receives the lines telling the user where to look (default:
    stderr). Returns ``True`` once the trace was fetched. Raises :class:`ExportError` when the file is missing
    or the port is taken, and :class:`ServeTimeoutError` when nothing fetched the trace in time.
    """
    trace = Path(path)
    if not trace.is_file():
        raise ExportError("no such trace file to open", where=str(trace))
    if not 1 <= port <= 65535:
        raise ExportError(f"port {port} is out of range", where="--port", hint="use a port between 1 and 65535")
    if timeout_s <= 0:
        raise ExportError(f"timeout must be positive, got {timeout_s}", where="--timeout")
    try:
        server = _OneFileServer(port, trace)
    except OSError as exc:
        raise ExportError(
            f"cannot listen on {LOOPBACK}:{port} ({exc.strerror or exc})",
            where="--port",
            hint="another server (maybe an earlier --open) holds the port; stop it or pick another --port"
            + (" (ui.perfetto.dev only fetches from port 9001)" if port == DEFAULT_PORT else ""),
        ) from None
    url = perfetto_url(trace.name, port)
    say = notify or _notify_stderr
    try:
        say(f"serving {trace.name} on http://{LOOPBACK}:{port} for up to {timeout_s:g} s; open {url}")
        if (opener or webbrowser.open)(url) is False:
            say(
                f"no web browser could be opened on this machine: open {PERFETTO_ORIGIN} and load the file "
                f"{trace} (Open trace file), or open {url} while a server holds it"
            )
            return False
        deadline = time.monotonic() + timeout_s
        while not server.served:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ServeTimeoutError(
                    f"nothing fetched the trace within {timeout_s:g} s",
                    where=str(trace),
                    hint=f"open {url} in a browser on this machine, or load the file in ui.perfetto.dev by hand",
                )
            server.timeout = min(left, 0.5)
            server.handle_request()
        return True
    finally:
        server.server_close()
