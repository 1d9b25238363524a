"""``SimulationResult``: the raw schedule of a run, turned into a ``Timeline`` and statistics on demand."""

from __future__ import annotations

from dataclasses import dataclass, field

from opgraph.ir import Bound, Scalar, Span, SpanCategory, Timeline, TimelineKind, TimelineSource
from opgraph.ir.gcpause import paused_gc
from opgraph.ir.timeline import span_factory
from simulators.config import SimulationConfig
from simulators.kernel import KernelResult
from simulators.problem import SchedulingProblem
from simulators.stats import SimulationStats, compute_stats

_make_span = span_factory()
"""Spans valid by construction, built without validating each (a 100k-op timeline is several times faster)."""


@dataclass
class SimulationResult:
    """A finished simulation: per-rank start, duration and engine of every op, and its settings."""

    problem: SchedulingProblem
    config: SimulationConfig
    kernel: KernelResult
    policy_name: str
    host_per_op_us: float
    hardware_name: str = ""
    cost_model_name: str = ""
    notes: list[str] = field(default_factory=list)
    _timeline: Timeline | None = field(default=None, repr=False)
    _stats: SimulationStats | None = field(default=None, repr=False)

    @property
    def makespan_us(self) -> float:
        """End of the last op on any rank."""
        return self.kernel.makespan_us

    @property
    def host_segments(self) -> list[tuple[int, int]]:
        """Program-index ranges the host issued without waiting (each but the last ends at a sync op)."""
        return self.kernel.host_segments

    def provenance(self) -> dict[str, Scalar]:
        """Settings for the timeline's source and the statistics."""
        out: dict[str, Scalar] = {"hardware": self.hardware_name, "cost_model": self.cost_model_name}
        out.update(self.config.provenance())
        out["host_per_op_us"] = self.host_per_op_us
        return out

    def stats(self) -> SimulationStats:
        """Typed statistics (computed once)."""
        if self._stats is None:
            self._stats = compute_stats(
                self.kernel,
                self.problem,
                host=self.config.host,
                policy=self.policy_name,
                host_per_op_us=self.host_per_op_us,
                config=self.provenance(),
                notes=self.notes,
            )
        return self._stats

    def timeline(self) -> Timeline:
        """Every rank's spans in one timeline (track names carry ``rankN/`` when ``tp > 1``)."""
        if self._timeline is None:
            with paused_gc():
                spans = [s for r in range(len(self.kernel.ranks)) for s in self._spans(r)]
                self._timeline = self._make_timeline(spans, self._name())
        return self._timeline

    def rank_timelines(self) -> list[Timeline]:
        """One timeline per rank (one Perfetto process each)."""
        if len(self.kernel.ranks) == 1:
            return [self.timeline()]
        with paused_gc():
            return [
                self._make_timeline(self._spans(r), f"{self._name()} rank{r}") for r in range(len(self.kernel.ranks))
            ]

    # ---------------------------------------------------------------- helpers
    def _name(self) -> str:
        parts = ["sim", self.hardware_name, f"{self.config.engines}eng", self.policy_name]
        if self.config.tp > 1:
            parts.append(f"tp{self.config.tp}")
        return " ".join(p for p in parts if p)

    def _make_timeline(self, spans: list[Span], name: str) -> Timeline:
        spans.sort(key=lambda s: (s.start_us, s.track))
        notes = list(self.notes)
        pb = self.problem
        n_free = sum(pb.free) - len(pb.uncosted)
        if n_free:
            notes.append(f"{n_free} op(s) launch no kernel (views) and have no span")
        if pb.uncosted:
            notes.append(
                f"{len(pb.uncosted)} uncosted op(s) were skipped (simulated as free): "
                + ", ".join(str(u.op_id) for u in pb.uncosted[:20])
                + (" ..." if len(pb.uncosted) > 20 else "")
            )
        source = TimelineSource(
            kind=TimelineKind.SIMULATED,
            name=name,
            device=self.hardware_name,
            graph_model=pb.graph.metadata.model,
            config=self.provenance(),
        )
        return Timeline.model_construct(
            source=source, spans=tuple(spans), wall_us=self.makespan_us, notes=tuple(notes), schema_version=1
        )

    def _spans(self, rank: int) -> list[Span]:
        k = self.kernel
        rec = k.ranks[rank]
        tracks = k.tracks
        ops = self.problem.ops
        bound = self.problem.bound
        construct = _make_span
        tp = len(k.ranks)
        rank_args: dict[str, Scalar] = {"rank": rank} if tp > 1 else {}
        out: list[Span] = []
        append = out.append
        for i, t in enumerate(rec.track):
            if t < 0:
                continue
            op = ops[i]
            append(
                construct(
                    {
                        "name": op.definition,
                        "track": tracks[t],
                        "start_us": rec.start_us[i],
                        "dur_us": rec.dur_us[i],
                        "op_id": op.id,
                        "kind": op.kind,
                        "category": None,
                        "layer": op.layer,
                        "stage": op.stage,
                        "step": op.step,
                        "definition": op.definition,
                        "bound": bound[i],
                        "args": dict(rank_args),
                    }
                )
            )
        if self.config.host.record:
            host_track = f"rank{rank}/host" if tp > 1 else "host"
            hus = k.host_us
            for i, issue in enumerate(rec.issue_us):
                h = hus[i]
                if h <= 0:
                    continue
                op = ops[i]
                append(
                    construct(
                        {
                            "name": f"launch {op.definition}",
                            "track": host_track,
                            "start_us": issue - h,
                            "dur_us": h,
                            "op_id": None,
                            "kind": op.kind,
                            "category": SpanCategory.HOST,
                            "layer": op.layer,
                            "stage": op.stage,
                            "step": op.step,
                            "definition": None,
                            "bound": Bound.HOST,
                            "args": {"op": op.id, **rank_args},
                        }
                    )
                )
        return out
