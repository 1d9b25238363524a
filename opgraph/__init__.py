"""opgraph: capture a transformer into a typed operator graph, simulate it on hardware, and check
the prediction against measured runs.

``import opgraph`` is cheap: it loads the IR only. Capture (which needs torch and transformers) is
imported on first use of :func:`capture` or :func:`tracing` (``opgraph.capture`` is then the package
:mod:`opgraph.capture`, callable as its :func:`~opgraph.capture.capture`); the simulators on first use
of :func:`run_study` (one simulation study: shard, cost, run or sweep engine counts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opgraph.ir import (
    DType,
    Edge,
    EdgeKind,
    GraphMetadata,
    LoadError,
    OpBase,
    OpGraph,
    OpgraphError,
    OpKind,
    Span,
    Stage,
    TensorSpec,
    Timeline,
    TimelineKind,
    TimelineSource,
    critical_path,
    load_graph,
    load_timeline,
    parallelism_profile,
    save_graph,
    save_timeline,
    topological_generations,
)

__version__ = "0.1.0"

if TYPE_CHECKING:  # pragma: no cover
    from opgraph.capture import capture, tracing
    from opgraph.study import StudyResult, run_study, study_config

_LAZY = {
    "capture": "opgraph.capture",
    "tracing": "opgraph.capture",
    "run_study": "opgraph.study",
    "study_config": "opgraph.study",
    "StudyResult": "opgraph.study",
}


_CALLABLE_PACKAGES = frozenset({"capture"})
"""Facade functions named like a subpackage. Importing the subpackage binds ``opgraph.<name>`` to the
module (Python sets a package's attribute to each submodule it imports), so the module is callable
as the function (see :mod:`opgraph.capture`) and the facade hands out the module: the attribute is
one object before and after any ``import opgraph.<name>``."""


def __getattr__(name: str) -> Any:
    """Import the lazy facade names (:data:`_LAZY`) on first use."""
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return module if name in _CALLABLE_PACKAGES else getattr(module, name)
    raise AttributeError(f"module 'opgraph' has no attribute {name!r}")


__all__ = [
    "DType",
    "Edge",
    "EdgeKind",
    "GraphMetadata",
    "LoadError",
    "OpBase",
    "OpGraph",
    "OpKind",
    "OpgraphError",
    "Span",
    "Stage",
    "StudyResult",
    "TensorSpec",
    "Timeline",
    "TimelineKind",
    "TimelineSource",
    "__version__",
    "capture",
    "critical_path",
    "load_graph",
    "load_timeline",
    "parallelism_profile",
    "run_study",
    "save_graph",
    "save_timeline",
    "study_config",
    "topological_generations",
    "tracing",
]
