"""``opgraph schema``: the JSON schema of every type opgraph saves."""

from __future__ import annotations

import json
from typing import Any

import typer

from opgraph.cli.common import command, fail

#: Saved types by name -> ``module:Class``. Each package adds its saved types here.
SAVED_TYPES: dict[str, str] = {
    "graph": "opgraph.ir:OpGraph",
    "timeline": "opgraph.ir:Timeline",
    "catalog": "opgraph.catalog:Catalog",
    "hardware": "hardware:HardwareSpec",
    "cost_table": "hardware:CostTable",
    "analysis": "opgraph.trace.result:AnalysisResult",
    "replay_result": "validators.results:ReplayResult",
    "simulation_config": "simulators:SimulationConfig",
    "simulation_stats": "simulators:SimulationStats",
    "engine_sweep": "simulators:EngineSweep",
    "report_table": "opgraph.export:ReportTable",
    "scenario": "opgraph.scenario:Scenario",
    "scenario_summary": "opgraph.scenario:ScenarioSummary",
    "coverage_report": "validators.coverage:CoverageReport",
    "comparison": "opgraph.compare:Comparison",
    "validation_summary": "opgraph.scenario.validation:ValidationSummary",
    "serving_result": "simulators.serving:ServingResult",
}


def schemas() -> dict[str, Any]:
    """JSON schema of each saved type, by name."""
    from pydantic import BaseModel

    from opgraph.ir import import_object

    out: dict[str, Any] = {}
    for name, spec in SAVED_TYPES.items():
        cls = import_object(spec)
        assert isinstance(cls, type) and issubclass(cls, BaseModel)
        out[name] = cls.model_json_schema()
    return out


@command("schema")
def schema(
    name: str = typer.Argument(None, help=f"One type ({', '.join(SAVED_TYPES)}); all when omitted."),
) -> None:
    """Print the JSON schema of the files opgraph saves."""
    everything = schemas()
    if name is None:
        typer.echo(json.dumps(everything, indent=2, sort_keys=True))
    elif name in everything:
        typer.echo(json.dumps(everything[name], indent=2, sort_keys=True))
    else:
        raise fail(f"unknown type {name!r}; known: {', '.join(everything)}")
