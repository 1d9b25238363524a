"""``OPGRAPH_TRACE=out.json python script.py``: record an unmodified script and write its graph at exit.

Three ways to turn it on:

* the interpreter-start hook: ``opgraph_trace.pth`` (shipped beside this module) holds one line that
  does nothing unless ``OPGRAPH_TRACE`` is set; placed in ``site-packages`` (``python -m
  opgraph.capture.autotrace --install-hook``) it makes the variable work for every script;
* ``python -m opgraph.capture.autotrace script.py [args]`` with ``OPGRAPH_TRACE`` set (no hook needed);
* ``opgraph.capture.autotrace.start(path)`` from code.

The graph is written atomically when the interpreter exits (``.json`` or ``.json.gz``); stages are
not known to a plain script, so ops carry no stage unless the script calls ``set_stage``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import sys
from pathlib import Path
from typing import Any

ENV = "OPGRAPH_TRACE"
"""The environment variable naming the output graph file."""

HOOK_LINE = (
    "import os; os.environ.get('OPGRAPH_TRACE') and __import__('opgraph.capture.autotrace', "
    "fromlist=['start']).start()\n"
)
"""The one line of ``opgraph_trace.pth`` (cheap when the variable is unset: no opgraph import)."""

_active: dict[str, Any] = {}


def start(path: str | None = None) -> None:
    """Begin recording everything PyTorch runs from now on; write the graph to ``path`` at exit."""
    if _active:
        return
    out = path or os.environ.get(ENV)
    if not out:
        return
    os.environ.pop(ENV, None)  # child processes (dataloader workers, compilers) are not traced
    from opgraph.capture.recorder import Recorder

    rec = Recorder()
    ctx = rec.recording()
    ctx.__enter__()
    _active.update(recorder=rec, ctx=ctx, path=out, argv=list(sys.argv))
    atexit.register(_finish)


def set_stage(stage: str | None, step: int | None = None) -> None:
    """Tag what runs from now on (``prefill``/``decode``) in an active trace."""
    rec = _active.get("recorder")
    if rec is not None:
        rec.stage, rec.step = stage, step


def _finish() -> None:
    if not _active:
        return
    rec, ctx, path = _active["recorder"], _active["ctx"], _active["path"]
    _active.clear()
    with contextlib.suppress(Exception):
        ctx.__exit__(None, None, None)
    from opgraph.capture.api import graph_from_recording
    from opgraph.ir.graph import CaptureSettings
    from opgraph.ir.io import save_graph

    script = Path(_script_name()).name or "script"
    graph, _ = graph_from_recording(
        rec, model=script, phase="trace", settings=CaptureSettings.model_validate({"script": script})
    )
    save_graph(graph, path)
    print(f"opgraph: traced {len(graph.ops)} ops -> {path}", file=sys.stderr)


def _script_name() -> str:
    argv = sys.argv or [""]
    return argv[0]


def hook_file() -> Path:
    """The shipped ``.pth`` file."""
    return Path(__file__).with_name("opgraph_trace.pth")


def install_hook(site_dir: str | None = None) -> Path:
    """Copy the ``.pth`` hook into ``site_dir`` (default: the first site-packages); returns its path."""
    import site

    target = Path(site_dir or site.getsitepackages()[0]) / "opgraph_trace.pth"
    target.write_text(HOOK_LINE)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m opgraph.capture.autotrace [--install-hook | script.py args...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if args[0] == "--install-hook":
        print(install_hook(args[1] if len(args) > 1 else None))
        return 0
    if not os.environ.get(ENV):
        print(f"error: set {ENV}=out.json to name the graph file", file=sys.stderr)
        return 2
    script = args[0]
    sys.argv = args
    start()
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
