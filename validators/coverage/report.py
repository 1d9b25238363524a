"""The operator coverage report: which expected operators a graph contains, in the seed's format."""

from __future__ import annotations

from collections import Counter
from typing import ClassVar, Literal

from opgraph.ir import GraphIdentity, OpGraph, OpKind
from opgraph.ir.tensor import FrozenModel
from validators.coverage.families import Expectation

WIDTH = 70
"""Width of the report's rules."""


class OperatorCoverage(FrozenModel):
    """One expected operator: whether the graph has it, and how often."""

    operator: str
    """Operator name (``rmsnorm``)."""
    required: bool
    """A missing required operator fails verification."""
    count: int
    """Ops that count as it."""
    definitions: dict[str, int]
    """Their definition names with counts, most frequent first."""
    description: str = ""
    """What the operator is."""

    @property
    def covered(self) -> bool:
        """True when at least one op counts as it."""
        return self.count > 0


class CoverageReport(GraphIdentity):
    """The result of checking a graph against a family's expectations."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version; the loader refuses newer versions with a clear message and reads a file without one (written
    before it was kept) as version 1."""
    source: str = ""
    """The graph file."""
    family: str
    """Expectation family used."""
    auto: bool = False
    """True when the family was picked from the graph (``--expect auto``)."""
    total_definitions: int
    """Distinct definitions among the graph's kernel ops (views excluded)."""
    total_ops: int
    """Kernel ops in the graph (views excluded)."""
    operators: tuple[OperatorCoverage, ...]
    """Required operators first, then optional, each in the order the family lists them."""
    unmatched: dict[str, int]
    """Operations of the graph that no expected operator counts, with op counts."""

    @property
    def missing_required(self) -> list[str]:
        """Required operators with no op."""
        return [o.operator for o in self.operators if o.required and not o.covered]

    @property
    def ok(self) -> bool:
        """True when every required operator is covered."""
        return not self.missing_required


def verify_graph(graph: OpGraph, expectation: Expectation, *, source: str = "", auto: bool = False) -> CoverageReport:
    """Count the ops of ``graph`` that make up each operator ``expectation`` names."""
    from opgraph.ir.configs import operation_name

    kernel_ops = [o for o in graph.ops if o.kind is not OpKind.VIEW]
    rows: list[OperatorCoverage] = []
    matched_ids: set[int] = set()
    for name, required in [*((n, True) for n in expectation.required), *((n, False) for n in expectation.optional)]:
        spec = expectation.operators[name]
        defs: Counter[str] = Counter()
        for o in kernel_ops:
            if spec.matches(o):
                defs[o.definition] += 1
                matched_ids.add(o.id)
        rows.append(
            OperatorCoverage(
                operator=name,
                required=required,
                count=sum(defs.values()),
                definitions=dict(sorted(defs.items(), key=lambda kv: (-kv[1], kv[0]))),
                description=spec.description,
            )
        )
    unmatched: Counter[str] = Counter(operation_name(o) for o in kernel_ops if o.id not in matched_ids)
    return CoverageReport.from_metadata(
        graph.metadata,
        source=source,
        family=expectation.family,
        auto=auto,
        total_definitions=len({o.definition for o in kernel_ops}),
        total_ops=len(kernel_ops),
        operators=tuple(rows),
        unmatched=dict(sorted(unmatched.items(), key=lambda kv: (-kv[1], kv[0]))),
    )


def format_report(report: CoverageReport, *, verbose: bool = False) -> str:
    """The report as text, in the layout of the seed's trace verification report.

    ``verbose`` adds each operator's definitions with counts and the graph's unmatched operations.
    """
    heavy, light = "=" * WIDTH, "-" * WIDTH
    model = report.model or "?"
    if report.architecture:
        model += f" ({report.architecture})"
    lines = [heavy, "OPERATOR COVERAGE VERIFICATION REPORT", f"Model: {model}"]
    if report.phase:
        lines.append(f"Phase: {report.phase}")
    if report.source:
        lines.append(f"Graph: {report.source}")
    lines.append(f"Expectations: {report.family}{' (auto)' if report.auto else ''}")
    lines += [
        heavy,
        "",
        f"Total definitions traced: {report.total_definitions}",
        f"Total ops: {report.total_ops}",
        "",
        light,
        "OPERATOR COVERAGE:",
        light,
    ]
    name_width = max([15, *(len(r.operator) for r in report.operators)])
    for row in report.operators:
        mark = "✓" if row.covered else "✗" if row.required else "-"  # an absent optional operator is no failure
        kind = "(required)" if row.required else "(optional)"
        noun = "op" if row.count == 1 else "ops"
        lines.append(f"  {mark} {row.operator:<{name_width}} {kind:<12} [{row.count} {noun}]")
        if verbose:
            for d, n in row.definitions.items():
                lines.append(f"        {d}  [{n}]")
    if verbose and report.unmatched:
        lines += ["", light, "OTHER OPERATIONS (not in the expectations):", light]
        for name, n in report.unmatched.items():
            lines.append(f"    {name:<24} [{n} {'op' if n == 1 else 'ops'}]")
    lines += ["", light]
    missing = report.missing_required
    if missing:
        lines.append(f"STATUS: ✗ MISSING REQUIRED OPERATORS: {', '.join(missing)}")
    else:
        lines.append("STATUS: ✓ ALL REQUIRED OPERATORS COVERED")
    lines.append(heavy)
    return "\n".join(lines) + "\n"
