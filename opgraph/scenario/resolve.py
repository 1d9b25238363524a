"""The first step of a run: load and check everything the scenario names, before any long work.

A typo in a hardware name, a cost model, a policy, an operator list, a graph or a measured
timeline fails here in a second, naming the scenario's file and field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from opgraph.ir import OpGraph, OpgraphError
from opgraph.scenario.context import RunContext
from opgraph.scenario.model import ScenarioError

if TYPE_CHECKING:
    from hardware import CostModel, HardwareSpec
    from validators.coverage import Expectation


@dataclass
class Resolved:
    """What the scenario names, loaded and checked."""

    hardware: HardwareSpec
    cost_model: CostModel
    expectations: dict[str, Expectation | None]
    """Each phase's operator expectation (None: none, or ``auto`` from the captured graph)."""
    graphs: dict[str, OpGraph]
    """The phases given as graph files, loaded."""


def resolve(ctx: RunContext) -> Resolved:
    """Load and check everything the scenario names; :class:`ScenarioError` names the field at fault."""
    from hardware import default_cost_model, load_hardware, resolve_cost_model
    from simulators.policies import get_policy

    s = ctx.scenario
    try:
        hw = load_hardware(ctx.maybe_path(s.hardware.name, (".toml", ".json", ".gz")))
    except OpgraphError as exc:
        raise ctx.err(exc, "hardware.name") from None
    try:
        if s.hardware.cost_model is None and not s.hardware.cost_options:
            cost_model, _uncalibrated = default_cost_model(hw)
        else:
            spec = ctx.cost_spec(s.hardware.cost_model or "roofline")
            cost_model = resolve_cost_model(spec, **s.hardware.cost_options)
    except OpgraphError as exc:
        raise ctx.err(exc, "hardware.cost_model") from None
    except TypeError as exc:
        raise ScenarioError(
            f"the cost model does not take these options ({exc})", where=f"{ctx.file}: hardware.cost_options"
        ) from None
    try:
        get_policy(ctx.code_spec(s.simulation.policy))
    except OpgraphError as exc:
        raise ctx.err(exc, "simulation.policy") from None
    if s.simulation.tp > 1:
        try:
            from opgraph.transforms import shard_tensor_parallel  # noqa: F401
        except ImportError:
            raise ScenarioError(
                "tensor parallelism needs opgraph.transforms.shard_tensor_parallel, which this install lacks",
                where=f"{ctx.file}: simulation.tp",
            ) from None
    expectations: dict[str, Expectation | None] = {}
    for i, p in enumerate(s.phases):
        ops = s.expectations(p).operators
        where = f"phases[{i}].expect.operators" if p.expect and p.expect.operators is not None else "expect.operators"
        expectations[p.label] = operator_expectation(ctx, ops, where) if ops not in (None, "auto") else None
    graphs: dict[str, OpGraph] = {}
    for i, p in enumerate(s.phases):
        if p.graph is not None:
            from opgraph.ir import load_graph

            try:
                graphs[p.label] = load_graph(ctx.path_of(p.graph))
            except OpgraphError as exc:
                raise ctx.err(exc, f"phases[{i}].graph") from None
        if p.measured is not None and not ctx.path_of(p.measured).exists():
            raise ScenarioError(
                f"no such measured timeline {str(ctx.path_of(p.measured))!r}",
                where=f"{ctx.file}: phases[{i}].measured",
            )
    if s.model is not None and any(p.graph is None for p in s.phases):
        from opgraph.capture.sources import resolve as resolve_source

        try:
            resolve_source(ctx.maybe_path(s.model.source, (".json",)))
        except OpgraphError as exc:
            raise ctx.err(exc, "model.source") from None
    return Resolved(hw, cost_model, expectations, graphs)


def operator_expectation(ctx: RunContext, ops: str | list[str] | None, where: str) -> Expectation | None:
    """The operator expectation a scenario names: a list of operators, a family, or a ``.toml`` file."""
    from validators.coverage import Expectation, builtin_operators, load_expectation

    if ops is None:
        return None
    if isinstance(ops, list):
        known = builtin_operators()
        unknown = [o for o in ops if o not in known]
        if unknown:
            raise ScenarioError(
                f"unknown operator(s) {', '.join(unknown)}",
                where=f"{ctx.file}: {where}",
                hint=f"one of: {', '.join(sorted(known))}",
            )
        return Expectation(family="scenario", required=tuple(ops), operators=dict(known))
    try:
        name = str(ctx.path_of(ops)) if ops.endswith(".toml") else ops
        return load_expectation(name)
    except OpgraphError as exc:
        raise ctx.err(exc, where) from None
