"""Load a timeline saved by opgraph, or import a torch-profiler trace, whichever the file is."""

from __future__ import annotations

import json
from pathlib import Path

from opgraph.ir import LoadError, Timeline, load_timeline, read_json_bytes


def load_any_timeline(path: str | Path) -> Timeline:
    """An opgraph ``Timeline`` file, or a Kineto trace (file or folder) imported as a measured timeline."""
    p = Path(path)
    if p.is_dir():
        from opgraph.trace import load_trace

        return load_trace(p)
    head = read_json_bytes(p)[:4096]
    if b'"traceEvents"' in head or b'"schema_version"' not in head:
        try:
            probe = json.loads(read_json_bytes(p))
        except (json.JSONDecodeError, UnicodeDecodeError):
            probe = None
        if isinstance(probe, dict) and "traceEvents" in probe:
            from opgraph.trace import load_trace

            return load_trace(p)
        if isinstance(probe, dict) and "schema_version" not in probe:
            raise LoadError(
                "neither an opgraph timeline nor a profiler trace (no schema_version, no traceEvents)", where=str(p)
            )
    return load_timeline(p)
