"""The HTML report in a real headless Chromium: the visible text shows the numbers, the charts render.

Needs Debian's ``chromium`` (and ``chromium-driver`` for the visible-text test); skipped with a
reason when they are absent. The WebDriver protocol is spoken with urllib, so no selenium is needed.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from export_fixtures import graph, measured, simulated

from opgraph.export import KIND_COLORS, write_html_report
from opgraph.export.stats import fmt_pct, fmt_us, summarize

pytestmark = pytest.mark.browser

CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
TIMEOUT_S = 120


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium not found (apt-get install chromium chromium-driver)")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Any]]:
    g = graph()
    sim, meas = simulated(g), measured(g)
    path = write_html_report(tmp_path_factory.mktemp("report") / "report.html", timelines=[sim, meas], graph=g)
    return path, [summarize(sim, 0, g), summarize(meas, 1, g)]


def test_dump_dom_and_screenshot(report: tuple[Path, list[Any]], tmp_path: Path) -> None:
    chrome = _chromium()
    path, sums = report
    dom = subprocess.run(
        [chrome, *CHROME_FLAGS, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=TIMEOUT_S
    ).stdout
    assert "<svg" in dom
    for s in sums:
        assert fmt_us(s.makespan_us) in dom
    shot = tmp_path / "shot.png"
    subprocess.run(
        [chrome, *CHROME_FLAGS, "--hide-scrollbars", "--window-size=1280,1600", f"--screenshot={shot}", path.as_uri()],
        capture_output=True, timeout=TIMEOUT_S, cwd=tmp_path,
    )  # fmt: skip
    import matplotlib.image as mpimg

    px = (mpimg.imread(shot)[:, :, :3] * 255).round().astype(int)
    assert px.shape[:2] == (1600, 1280)
    gemm = np.array([int(KIND_COLORS["gemm"][i : i + 2], 16) for i in (1, 3, 5)])
    assert int((np.abs(px - gemm).sum(axis=2) <= 6).sum()) > 500  # the charts were drawn


class WebDriver:
    """The few W3C WebDriver calls the test needs, over HTTP to a local chromedriver."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        caps = {
            "capabilities": {
                "alwaysMatch": {"goog:chromeOptions": {"args": [*CHROME_FLAGS, "--window-size=1280,1000"]}}
            }
        }
        self.session = self._call("POST", "/session", caps)["sessionId"]

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.base + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return json.loads(r.read())["value"]

    def get(self, url: str) -> None:
        self._call("POST", f"/session/{self.session}/url", {"url": url})

    def js(self, script: str) -> Any:
        return self._call("POST", f"/session/{self.session}/execute/sync", {"script": script, "args": []})

    def screenshot(self) -> bytes:
        return base64.b64decode(self._call("GET", f"/session/{self.session}/screenshot"))

    def quit(self) -> None:
        self._call("DELETE", f"/session/{self.session}")


@pytest.fixture
def webdriver() -> Iterator[WebDriver]:
    _chromium()
    driver_bin = shutil.which("chromedriver")
    if driver_bin is None:
        pytest.skip("chromedriver not found (apt-get install chromium-driver)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen([driver_bin, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as r:
                    if json.loads(r.read())["value"].get("ready"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("chromedriver did not start within 30 s")
            time.sleep(0.2)
        wd = WebDriver(port)
        try:
            yield wd
        finally:
            wd.quit()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_visible_text_shows_the_numbers(report: tuple[Path, list[Any]], webdriver: WebDriver) -> None:
    path, sums = report
    webdriver.get(path.as_uri())
    text = webdriver.js("return document.body.innerText")
    for s in sums:
        assert s.label in text
        assert fmt_us(s.makespan_us) in text
        for row in s.by_kind:
            assert fmt_us(row.total_us) in text
        for track in s.track_rows:
            assert fmt_pct(track.utilisation) in text
    assert "Critical path" in text and "Comparison with the measured run" in text
    # Every chart is laid out with a real size, and nothing overflows the page sideways.
    sizes = webdriver.js("return [...document.querySelectorAll('svg')].map(e => e.getBoundingClientRect().width)")
    assert sizes and min(sizes) > 100
    assert webdriver.js("return document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert webdriver.screenshot()[:8] == b"\x89PNG\r\n\x1a\n"
