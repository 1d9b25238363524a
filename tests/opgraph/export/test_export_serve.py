"""``open_in_perfetto``: one file served once on loopback with the CORS header, with a local client for a browser."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from opgraph.export import ExportError, ServeTimeoutError, open_in_perfetto, perfetto_url

TIMEOUT_S = 20.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _trace(tmp_path: Path, name: str = "my trace.json.gz") -> Path:
    p = tmp_path / name
    p.write_bytes(b"\x1f\x8b" + bytes(range(256)) * 10)
    return p


class FakeBrowser:
    """Stands in for ui.perfetto.dev: fetches the ``url=`` of the page it is asked to open, first a wrong path."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.responses: list[tuple[int, dict[str, str], bytes]] = []
        self.thread: threading.Thread | None = None

    def __call__(self, url: str) -> bool:
        self.opened.append(url)
        target = urllib.parse.unquote(url.split("#!/?url=", 1)[1])
        wrong = target.rsplit("/", 1)[0] + "/etc/passwd"

        def fetch() -> None:
            for u, headers in ((wrong, {}), (target, {"Origin": "https://ui.perfetto.dev"})):
                req = urllib.request.Request(urllib.parse.quote(u, safe=":/"), headers=headers)
                try:
                    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
                        self.responses.append((r.status, dict(r.headers), r.read()))
                except urllib.error.HTTPError as exc:
                    self.responses.append((exc.code, dict(exc.headers), b""))

        self.thread = threading.Thread(target=fetch, daemon=True)
        self.thread.start()
        return True


def test_serves_the_file_once_with_cors(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    port = _free_port()
    browser = FakeBrowser()
    lines: list[str] = []
    open_in_perfetto(trace, port=port, timeout_s=TIMEOUT_S, opener=browser, notify=lines.append)
    assert browser.thread is not None
    browser.thread.join(TIMEOUT_S)
    assert browser.opened == [f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/my%20trace.json.gz"]
    (bad_status, _, _), (status, headers, body) = browser.responses
    assert bad_status == 404
    assert status == 200 and body == trace.read_bytes()
    assert headers["Access-Control-Allow-Origin"] == "https://ui.perfetto.dev"
    assert "127.0.0.1" in lines[0] and browser.opened[0] in lines[0]
    # Served once: nothing listens any more.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S).close()


def test_times_out_when_nothing_fetches(tmp_path: Path) -> None:
    with pytest.raises(ServeTimeoutError, match=r"within 0\.3 s"):
        open_in_perfetto(
            _trace(tmp_path), port=_free_port(), timeout_s=0.3, opener=lambda url: None, notify=lambda m: None
        )


def test_busy_port_and_bad_arguments(tmp_path: Path) -> None:
    trace = _trace(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = int(s.getsockname()[1])
        with pytest.raises(ExportError, match=f"cannot listen on 127.0.0.1:{port}"):
            open_in_perfetto(trace, port=port, timeout_s=1, opener=lambda url: None, notify=lambda m: None)
    with pytest.raises(ExportError, match="no such trace file"):
        open_in_perfetto(tmp_path / "missing.json", port=_free_port(), timeout_s=1)
    with pytest.raises(ExportError, match="out of range"):
        open_in_perfetto(trace, port=70000, timeout_s=1)


def test_url_matches_perfettos_open_trace_in_ui() -> None:
    assert perfetto_url("trace.json") == "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/trace.json"
