"""Capture of PyTorch / Hugging Face causal LMs into the typed op graph.

``capture(model_or_id, phase=..., ...)`` builds a model from a preset, config or local folder on the
chosen device (``meta`` by default: no weights) and records it; ``tracing()`` records whatever runs
inside a ``with`` block; ``profile_capture(...)`` also runs it under the torch profiler and returns a
measured :class:`~opgraph.ir.Timeline` whose kernels carry op ids. Importing this package imports
torch; ``import opgraph`` does not.
"""

from opgraph.capture.api import CaptureOptions, Tracing, capture, graph_from_recording, tracing
from opgraph.capture.lowering import DEFAULT_PIPELINE, PASSES
from opgraph.capture.phase import GreedyLoop
from opgraph.capture.profile import ProfiledCapture, profile_capture
from opgraph.capture.recorder import Recorder
from opgraph.capture.sources import (
    CaptureError,
    ConfigError,
    LayersError,
    ModelSource,
    Preset,
    find_preset,
    presets,
    resolve,
)

__all__ = [
    "DEFAULT_PIPELINE",
    "PASSES",
    "CaptureError",
    "CaptureOptions",
    "ConfigError",
    "GreedyLoop",
    "LayersError",
    "ModelSource",
    "Preset",
    "ProfiledCapture",
    "Recorder",
    "Tracing",
    "capture",
    "find_preset",
    "graph_from_recording",
    "presets",
    "profile_capture",
    "resolve",
    "tracing",
]
