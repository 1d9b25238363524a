"""Step costs of a served workload: a memo over bucketed step shapes, filled by op-graph simulations.

The provider knows nothing of capture: it is given ``graph_of`` (a step key to the op graph of that
step, e.g. templates rebatched by :func:`opgraph.transforms.rebatch`) and ``simulate_us`` (a graph
to its simulated makespan, e.g. :func:`opgraph.study.run_study`'s), and calls each once per key.
Given the model's sliding windows, its keys name the decodes' mean capped keys of each window
(:meth:`StepShape.key`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from opgraph.ir import OpGraph
from simulators.serving.shapes import StepKey, StepShape

__all__ = ["GraphStepCosts", "KeyedStepCosts", "StepCostModel"]


class StepCostModel(Protocol):
    """Anything that prices a step: microseconds for a step shape."""

    def step_us(self, shape: StepShape) -> float:
        """Duration of one step of ``shape`` in microseconds."""
        ...


@runtime_checkable
class KeyedStepCosts(StepCostModel, Protocol):
    """A step-cost model that prices a step by its bucketed key: the engine records that key."""

    def key(self, shape: StepShape) -> StepKey:
        """The key ``shape`` is priced by."""
        ...


class GraphStepCosts:
    """Step costs from op-graph simulations, memoised by :meth:`StepShape.key` (with the model's
    sliding ``windows``)."""

    def __init__(
        self,
        graph_of: Callable[[StepKey], OpGraph],
        simulate_us: Callable[[OpGraph], float],
        windows: Iterable[int] = (),
    ) -> None:
        self.graph_of = graph_of
        self.simulate_us = simulate_us
        self.windows = tuple(sorted(set(windows)))
        """The model's sliding windows (tokens)."""
        self.memo: dict[StepKey, float] = {}
        self.build_s = 0.0
        """Wall time spent building and simulating step graphs."""
        self.graph_s = 0.0
        """Of which building the graphs."""

    def key_us(self, key: StepKey) -> float:
        """The simulated time of the step graph of ``key`` (memoised)."""
        hit = self.memo.get(key)
        if hit is None:
            t0 = time.perf_counter()
            graph = self.graph_of(key)
            t1 = time.perf_counter()
            hit = self.memo[key] = float(self.simulate_us(graph))
            self.graph_s += t1 - t0
            self.build_s += time.perf_counter() - t0
        return hit

    def key(self, shape: StepShape) -> StepKey:
        """The bucketed key of ``shape`` for this model's windows."""
        return shape.key(self.windows)

    def step_us(self, shape: StepShape) -> float:
        """Duration of a step of ``shape``: its bucket's simulation."""
        return self.key_us(self.key(shape))
