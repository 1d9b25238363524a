"""Capture of PyTorch / Hugging Face causal LMs into the typed op graph.

``capture(model_or_id, phase=..., ...)`` builds a model from a preset, config or local folder on the
chosen device (``meta`` by default: no weights) and records it; ``tracing()`` records whatever runs
inside a ``with`` block; ``profile_capture(...)`` also runs it under the torch profiler and returns a
measured :class:`~opgraph.ir.Timeline` whose kernels carry op ids. Importing this package imports
torch; ``import opgraph`` does not.

The package shares its name with the facade function ``opgraph.capture``, and Python binds the
attribute ``opgraph.capture`` to this module whenever the package is imported (by ``import
opgraph.capture``, ``from opgraph.capture import ...`` or the facade's own lazy import). So the
module itself is callable: ``opgraph.capture(model, ...)`` is :func:`capture` whichever object the
attribute holds. For the same reason a submodule named like a public function would replace it on
import; the module refuses that binding, so ``import opgraph.capture.presets`` (the folder of preset
configs) leaves :func:`presets` in place.
"""

import inspect
import sys
import types
from typing import Any

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
from opgraph.ir import OpGraph


class _CallableModule(types.ModuleType):
    """This package's module type: calling the module calls :func:`capture`, and importing a submodule
    never rebinds one of the package's public names (:data:`__all__`)."""

    def __call__(self, *args: Any, **kwargs: Any) -> OpGraph:
        """Capture a causal LM into a typed op graph: :func:`opgraph.capture.capture`."""
        return capture(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute, except the import system's binding of a submodule over a public name.

        Python sets ``opgraph.capture.<child>`` to each submodule it loads. The folder of shipped
        preset configs, ``presets/``, has no ``__init__.py``, so ``import opgraph.capture.presets``
        loads it as a namespace package and would replace :func:`presets` with it. Such a binding is
        skipped: the submodule stays in ``sys.modules``, the public name keeps its object.
        """
        if isinstance(value, types.ModuleType) and name in __all__ and value.__name__ == f"{self.__name__}.{name}":
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _CallableModule
__signature__ = inspect.signature(capture)
"""``inspect.signature(opgraph.capture)`` gives :func:`capture`'s, as the module calls it."""

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
