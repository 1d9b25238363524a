"""Issue time in the model's order: every op of the graphs called once, in sequence.

Replay times each config on its own, so the host code that issues it (Python, the dispatcher,
backend selection, the launch) stays hot in the CPU's caches: in a burst of calls of one op the
issue time is a lower bound. In a model run every call follows the calls of other ops. This pass
builds the cases of all configs at once and calls them in the graphs' op order, timing each call
on the host; a config's issue time is the median over its uses and the rounds after the first.

Only the host side is measured: the device keeps the kernels' order but not the model's data, and
the queue is drained every few ops so that no launch waits for room in it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError

from validators.configs import OpConfig, config_key

if TYPE_CHECKING:
    from opgraph.ir import OpGraph
    from validators.replay import Replayer


class SequenceIssue(BaseModel):
    """Per config key, the median host time (us) to issue one call in the graphs' op order.

    ``opgraph replay --issue-only`` saves one as JSON; ``opgraph calibrate --issue`` takes its issue
    times instead of the replay results' (:func:`load_issue`).
    """

    model_config = ConfigDict(frozen=True)

    version: int = 1
    us_by_key: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    calls: int = 0
    """Calls per round (op uses whose config was built)."""
    rounds: int = 0
    """Timed rounds (after one warm-up round)."""
    note: str = ""
    """Why the pass was skipped or what it left out; empty when every config took part."""
    device_name: str = ""
    """The device the cases ran on."""
    created: str = ""
    """When it was measured (ISO 8601)."""

    @classmethod
    def of_rounds(cls, rounds: Sequence[Mapping[str, Sequence[float]]], calls: int, note: str = "") -> SequenceIssue:
        """The medians over the uses of each config in all ``rounds`` (from :meth:`IssueSequence.round`)."""
        merged: dict[str, list[float]] = {}
        for r in rounds:
            for key, xs in r.items():
                merged.setdefault(key, []).extend(xs)
        return cls(
            us_by_key={k: statistics.median(v) for k, v in merged.items() if v},
            calls=calls,
            rounds=len(rounds),
            note=note,
        )


def load_issue(path: str | Path) -> SequenceIssue:
    """A :class:`SequenceIssue` saved as JSON; :class:`~opgraph.ir.LoadError` when it is not one."""
    from opgraph.ir import LoadError
    from opgraph.ir.io import read_json_bytes

    data = read_json_bytes(path)
    try:
        return SequenceIssue.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "top level"
        raise LoadError(
            f"not an issue-time file ({where}: {first['msg']})",
            where=str(path),
            hint="write one with `opgraph replay GRAPH --device cuda --issue-only -o FILE`",
        ) from None


class IssueSequence:
    """The cases of ``configs`` built once, then called in the op order of ``graphs`` by :meth:`round`.

    Cases are built with ``replayer``'s recipes and seeds; configs with no recipe or a failed build
    are left out and named in :attr:`note`. When the inputs of all cases would take more than
    ``memory_fraction`` of a CUDA device's memory none is kept (:attr:`calls` is 0, the note says
    why). Use it as a context manager, or :meth:`close` it, to free the cases.
    """

    def __init__(
        self,
        graphs: Iterable[OpGraph],
        configs: Sequence[OpConfig],
        replayer: Replayer,
        *,
        sync_every: int = 64,
        memory_fraction: float = 0.5,
        moe_skew: float = 0.0,
    ) -> None:
        import torch

        self.device = replayer.device
        self.sync_every = max(1, sync_every)
        self.note = ""
        on_cuda = self.device.type == "cuda"
        wanted = {c.key: c for c in configs}
        order = [k for g in graphs for k in (config_key(op) for op in g.ops) if k in wanted]
        budget = memory_fraction * torch.cuda.get_device_properties(self.device).total_memory if on_cuda else 0.0
        base = torch.cuda.memory_allocated(self.device) if on_cuda else 0
        cases: dict[str, Any] = {}
        left_out: list[str] = []
        try:
            for key in dict.fromkeys(order):
                case = replayer.build_case(wanted[key], moe_skew=moe_skew)
                if case is None:
                    left_out.append(wanted[key].op.definition)
                    continue
                cases[key] = case
                if on_cuda and torch.cuda.memory_allocated(self.device) - base > budget:
                    cases.clear()
                    self.note = f"issue in sequence skipped: the cases' inputs need over {budget / 2**30:.0f} GiB"
                    break
        except torch.cuda.OutOfMemoryError:
            cases.clear()
            self.note = "issue in sequence skipped: out of device memory"
        if left_out and not self.note:
            self.note = f"not in the sequence (no recipe or build failed): {', '.join(sorted(set(left_out)))}"
        self._calls = [(k, cases[k]) for k in order if k in cases]

    @property
    def calls(self) -> int:
        """Calls per round."""
        return len(self._calls)

    def round(self) -> dict[str, list[float]]:
        """Call every case once per use, in order; host microseconds per call, by config key.

        The device queue is drained every ``sync_every`` calls (untimed), so no launch waits for room.
        """
        from validators.timing import synchronize

        out: dict[str, list[float]] = {}
        clock = time.perf_counter_ns
        for i, (key, case) in enumerate(self._calls):
            if i % self.sync_every == 0:
                synchronize(self.device)
            t0 = clock()
            case()
            dt = clock() - t0
            out.setdefault(key, []).append(dt / 1e3)
        synchronize(self.device)
        return out

    def close(self) -> None:
        """Free the cases (and, on CUDA, the allocator's cache)."""
        self._calls = []
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def __enter__(self) -> IssueSequence:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SequenceOptions(TypedDict, total=False):
    """The keyword options of :class:`IssueSequence` (defaults there), as :func:`issue_in_sequence` takes them."""

    sync_every: int
    memory_fraction: float
    moe_skew: float


def issue_in_sequence(
    graphs: Iterable[OpGraph],
    configs: Sequence[OpConfig],
    replayer: Replayer,
    *,
    rounds: int = 5,
    **options: Unpack[SequenceOptions],
) -> SequenceIssue:
    """Time the issue of every use of ``configs`` in the op order of ``graphs``: one warm-up round,
    then ``rounds`` timed ones (see :class:`IssueSequence`, whose options ``options`` are).

    On a CPU device the call is the whole op (there is no queue), so replay uses this on CUDA only.
    """
    with IssueSequence(graphs, configs, replayer, **options) as seq:
        if not seq.calls:
            return SequenceIssue(note=seq.note)
        seq.round()
        return SequenceIssue.of_rounds([seq.round() for _ in range(max(1, rounds))], seq.calls, seq.note)
