"""What ``opgraph validate`` writes into its folder's ``summary.json``: the steps it ran and the errors it found.

The models live here, beside :class:`~opgraph.scenario.ScenarioSummary`, so that
:mod:`opgraph.scenario.folder` can tell an earlier validation's folder from a folder of other files
without importing the CLI.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from opgraph.ir.tensor import FrozenModel

__all__ = ["ValidationStep", "ValidationSummary"]


class ValidationStep(FrozenModel):
    """One step of a validation that ran: the command that reproduces it and the files it wrote."""

    name: str
    done: bool
    detail: str = ""
    command: str = ""
    """The CLI command that reproduces the step, every setting in effect given (empty: the step is no command,
    e.g. copying a given graph into the folder)."""
    files: tuple[str, ...] = ()
    """Files the step wrote into the folder (names relative to it)."""
    seconds: float = 0.0


class ValidationSummary(FrozenModel):
    """What ``opgraph validate`` measured and predicted (``summary.json`` of its folder)."""

    schema_version: Literal[1] = 1
    """Format version; other versions are refused. A ``summary.json`` written before summaries carried one
    reads as version 1, so a new validation still replaces such a folder."""
    model: str
    device: str
    device_name: str = ""
    hardware: str
    settings: dict[str, Any] = Field(default_factory=dict)
    steps: tuple[ValidationStep, ...] = ()
    gpu_time_err: float | None = None
    """Predicted / measured device time - 1 (the profiled run's op spans)."""
    wall_time_err: float | None = None
    """Predicted / measured wall time (the median of the plain runs, without the profiler) - 1."""
    median_op_err: float | None = None
    wall_us: float | None = None
    """Wall time of the phase without the profiler or recorder (median of the plain runs)."""
    wall_profiled_us: float | None = None
    """Wall time of the profiled run, whose op spans the measured timeline holds."""
    notes: tuple[str, ...] = ()
    created: str = ""

    @property
    def files(self) -> frozenset[str]:
        """Every file the validation wrote into its folder, ``summary.json`` included."""
        return frozenset({"summary.json", *(f for s in self.steps for f in s.files)})
