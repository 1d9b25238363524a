"""Replay results: the pydantic record of one replayed config, JSONL streaming, resume and summaries.

Every line of a replay JSONL file is one :class:`ReplayResult`, written and flushed the moment it is
measured, so an interrupted run loses nothing it finished. :func:`load_results` reads a file back,
tolerating a torn last line (a crash mid-write) and keeping the newest record of each config.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import IO, Annotated, ClassVar, Literal

from pydantic import Field, ValidationError, model_validator

from opgraph.ir import DType, LoadError, Op, OpKind
from opgraph.ir.filekinds import describe_json, known_file
from opgraph.ir.io import check_schema_version
from opgraph.ir.tensor import FrozenModel, NonNegInt
from opgraph.ir.timeline import NonNegFloat


class ReplayStatus(str, Enum):
    """Outcome of replaying one config."""

    OK = "ok"
    """Ran, timed, and (when checked) matched the float64 reference."""
    MISMATCH = "mismatch"
    """Ran and was timed, but its outputs differ from the reference beyond the dtype's tolerance."""
    UNSUPPORTED = "unsupported"
    """No replay recipe for this op (``reason`` names the target)."""
    OOM = "oom"
    """The device ran out of memory building inputs or running the op."""
    ERROR = "error"
    """The op raised; ``reason`` has the exception."""
    SKIPPED = "skipped"
    """Deliberately not run (a collective outside a process group, a free view); ``reason`` says why."""


REPLAYED = frozenset({ReplayStatus.OK, ReplayStatus.MISMATCH})
"""Statuses of configs that ran and were timed."""


UNSETTLED_CI = 0.05
"""A median whose 95% confidence half-width is over this fraction of it is unsettled (too few samples
for their spread): replay flags it and ``calibrate`` leaves it out of the fit unless told otherwise."""

UNSETTLED_SPREAD = 0.25
"""Samples whose interquartile range is over this fraction of their median make a timing unsettled
(a machine busy with other work, clocks moving): the median is not the op's time."""


MeasuredTimer = Literal["cuda_kernels", "cuda_events", "cuda_events_no_lead", "perf_counter", "events", "cuda_graph"]
"""The clock a :class:`TimingStats` was measured with (the values replay has ever written)."""


class TimingStats(FrozenModel):
    """Device time of one call, over repeated samples."""

    median_us: NonNegFloat
    """Median time of one call, microseconds."""
    iqr_us: NonNegFloat
    """Interquartile range of the samples, microseconds."""
    mad_us: NonNegFloat
    """Median absolute deviation of the samples, microseconds."""
    spread: NonNegFloat
    """Relative spread: IQR / median."""
    min_us: NonNegFloat
    """Fastest sample."""
    mean_us: NonNegFloat
    """Mean of the samples."""
    samples: Annotated[int, Field(ge=1)]
    """Timed samples taken."""
    calls_per_sample: Annotated[int, Field(ge=1)] = 1
    """Calls averaged in each sample (more than one only for very short ops on the CPU)."""
    warmup_calls: Annotated[int, Field(ge=0)] = 0
    """Untimed calls before the samples."""
    timer: MeasuredTimer = "events"
    """How the samples were taken: ``cuda_kernels`` (kernel durations from the profiler),
    ``cuda_events`` (device events around each sample; ``_no_lead`` without a device-side lead),
    ``perf_counter`` (host clock); ``events`` and ``cuda_graph`` appear in older files."""
    cold_l2: bool = False
    """The L2 cache was flushed before each sample."""
    warm_inputs: tuple[int, ...] | None = None
    """With ``cold_l2``: the op's inputs read back into L2 after each flush (indices into the op's
    inputs: activations the model had just written); ``None`` when not flushed or not warmed."""
    dirty_l2_bytes: NonNegInt | None = None
    """With ``cold_l2`` and warm activations: bytes written (left dirty in L2) after each flush, as the
    op before it in the model leaves its output; ``None`` when not flushed that way."""
    attribution: str | None = None
    """How the ``cuda_kernels`` timer picked the op's kernels: ``range`` (kernels launched inside the
    op's profiler range), ``subtracted`` (all kernels minus the flush profiled alone), or both."""
    sm_clock_mhz: NonNegFloat | None = None
    """Median SM clock while the config was timed (NVML), to tell clock drift from run to run."""
    host_us: NonNegFloat | None = None
    """Median host (CPU) time to issue one call, when measured: in the graphs' op order when
    ``host_burst_us`` is set (:mod:`validators.sequence`), else in a burst of calls of this op."""
    host_burst_us: NonNegFloat | None = None
    """The issue time in a burst of calls of this op alone (hot CPU caches), when ``host_us`` was
    timed in sequence instead."""
    host_ref_us: NonNegFloat | None = None
    """The issue time of a reference call (a one-element in-place add), timed in the same bursts as
    the op's: the host's speed when the op's issue time was measured."""
    converged: bool = True
    """The median's confidence interval reached the target before the sample or time cap."""

    @property
    def ci_rel(self) -> float:
        """Approximate relative 95% confidence half-width of the median."""
        if self.median_us <= 0:
            return 0.0
        return 1.57 * self.iqr_us / math.sqrt(self.samples) / self.median_us

    @property
    def instability(self) -> str:
        """Why the median is not to be trusted as the op's time, ``""`` when it settled.

        Unsettled: its 95% confidence half-width is over :data:`UNSETTLED_CI` of it (``median ±16%
        after 9 samples``), or the samples spread (IQR / median) over :data:`UNSETTLED_SPREAD`.
        A timing that did not reach replay's tighter ``--target-ci`` but is within these is settled.
        """
        why = []
        if self.ci_rel > UNSETTLED_CI:
            why.append(f"median ±{100 * self.ci_rel:.2g}% after {self.samples} samples")
        if self.spread > UNSETTLED_SPREAD:
            why.append(f"spread {self.spread:.0%}")
        return ", ".join(why)


class NumericCheck(FrozenModel):
    """The replayed outputs against a float64 reference computed from the same inputs."""

    ok: bool
    """Within tolerance (or nothing comparable)."""
    max_abs: NonNegFloat = 0.0
    """Largest absolute difference over all compared outputs."""
    max_rel: NonNegFloat = 0.0
    """Largest difference relative to ``max(|reference|, atol)``, element-wise."""
    atol: NonNegFloat = 0.0
    """Absolute tolerance used (already scaled by the reference's RMS)."""
    rtol: NonNegFloat = 0.0
    """Relative tolerance used."""
    dtype: str = ""
    """Dtype whose tolerances were used."""
    compared: Annotated[int, Field(ge=0)] = 0
    """Output tensors compared."""
    reference_device: str = "cpu"
    """Where the float64 reference ran."""
    note: str = ""
    """Why some outputs were not compared (random ops, uninitialised memory, tie-prone indices)."""


class EnergyStats(FrozenModel):
    """Board energy while the op ran back to back, from NVML."""

    joules_per_call: NonNegFloat
    """Board energy of one call (total, idle included)."""
    dynamic_joules_per_call: NonNegFloat | None = None
    """Energy of one call above the idle board power measured at the start of the run."""
    avg_power_w: NonNegFloat
    """Mean board power over the window."""
    window_s: NonNegFloat
    """Length of the measuring window."""
    calls: Annotated[int, Field(ge=1)]
    """Calls in the window."""
    method: str = "energy_counter"
    """``energy_counter`` (NVML total-energy counter) or ``power_samples`` (integrated samples)."""


def _version_renamed(record: dict[str, object]) -> dict[str, object]:
    """A replay record with the ``version`` key of records written before ``schema_version`` under its new name."""
    if "version" in record and "schema_version" not in record:
        return {("schema_version" if k == "version" else k): v for k, v in record.items()}
    return record


class ReplayResult(FrozenModel):
    """One replayed config: what it is, where it ran, how long it took, whether it was right."""

    reads_unversioned: ClassVar[bool] = True

    schema_version: Literal[1] = 1
    """Format version of the record (records written before it was kept read as 1; their ``version``
    key, always 1, is the same number under its old name)."""
    key: str
    """Stable id of the config (hash of definition, shapes, dtypes, strides and call)."""
    definition: str
    """The op's definition name (``gemm_n4096_k4096``)."""
    kind: OpKind
    """Op kind."""
    target: str = ""
    """The aten overload or module the op came from."""
    dtype: DType
    """Compute dtype of the op."""
    op: Op
    """A representative op of the config (the first seen), with its shapes, dtypes and call."""
    count: Annotated[int, Field(ge=1)] = 1
    """How many times the model(s) run this config."""
    share: NonNegFloat | None = None
    """Estimated share of the model's op time spent in this config (all its uses), 0..1."""
    est_us: NonNegFloat | None = None
    """Estimated time of one call, from the cost estimate used for ``share``."""
    graphs: tuple[str, ...] = ()
    """Graphs (model/phase) the config came from."""
    recipe: str = ""
    """Replay recipe used."""
    status: ReplayStatus
    """Outcome."""
    reason: str = ""
    """Why it is not ``ok``: error text, unsupported target, mismatch summary."""
    device: str
    """Torch device (``cuda:0``, ``cpu``)."""
    device_name: str = ""
    """Device model (``NVIDIA H100 80GB HBM3``, the CPU model)."""
    timing: TimingStats | None = None
    """Timing, for replayed configs."""
    numerics: NumericCheck | None = None
    """Numeric check, when run."""
    energy: EnergyStats | None = None
    """Energy, where NVML is available and asked for."""
    torch_version: str = ""
    """torch version that ran it."""
    rank: Annotated[int, Field(ge=0)] = 0
    """Rank that replayed it under torchrun."""
    created: str = ""
    """ISO-8601 UTC time of the measurement."""

    @model_validator(mode="before")
    @classmethod
    def _old_version_key(cls, data: object) -> object:
        return _version_renamed(data) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _status_fields(self) -> ReplayResult:
        if self.status in REPLAYED and self.timing is None:
            raise ValueError(f"status {self.status.value} needs timing")
        if self.status is ReplayStatus.MISMATCH and (self.numerics is None or self.numerics.ok):
            raise ValueError("status mismatch needs a failed numeric check")
        if self.status not in (ReplayStatus.OK,) and self.status not in REPLAYED and not self.reason:
            raise ValueError(f"status {self.status.value} needs a reason")
        return self

    @property
    def median_us(self) -> float | None:
        """Median time of one call, or ``None`` when not timed."""
        return self.timing.median_us if self.timing else None

    @property
    def replayed(self) -> bool:
        """Ran and was timed (``ok`` or ``mismatch``)."""
        return self.status in REPLAYED


def now_iso() -> str:
    """The current UTC time, ISO-8601, seconds."""
    return datetime.now(UTC).replace(microsecond=0).isoformat()


class ResultWriter:
    """Appends :class:`ReplayResult` lines to a JSONL file, flushing (and fsyncing) each one.

    Opening in append mode keeps whatever an earlier, interrupted run wrote; a torn last line
    from a crash is terminated first so the next record starts on its own line.
    """

    def __init__(self, path: str | Path, *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        needs_newline = False
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                needs_newline = f.read(1) != b"\n"
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        if needs_newline:
            self._file.write("\n")
            self._file.flush()

    def write(self, result: ReplayResult) -> None:
        """Append one record and make it durable."""
        if self._file is None:
            raise ValueError(f"{self.path} is closed")
        self._file.write(result.model_dump_json() + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> ResultWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_results(path: str | Path, *, strict: bool = False, skipped: list[int] | None = None) -> Iterator[ReplayResult]:
    """Every record of a JSONL file in order; bad lines raise when ``strict``, else are skipped.

    A torn last line (no newline, not valid JSON) is always skipped: it is what a crash leaves.
    ``skipped``, when given, gets the (1-based) number of every line skipped, the torn one included.
    """
    p = Path(path)
    if not p.exists():
        raise LoadError("no such file", where=str(p))
    with p.open("r", encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            yield ReplayResult.model_validate_json(line)
        except ValidationError as exc:
            _check_line_version(line, f"{p}: line {i + 1}")
            torn = i == last
            if skipped is not None:
                skipped.append(i + 1)
            if strict and not torn:
                first = exc.errors()[0]
                loc = ".".join(str(x) for x in first["loc"]) or "(line)"
                raise LoadError(f"line {i + 1}: {loc}: {first['msg']}", where=str(p)) from None


def _check_line_version(line: str, where: str) -> None:
    """Refuse a record of a ``schema_version`` this opgraph does not read, rather than skip it as unreadable."""
    import json

    try:
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return
    if isinstance(record, dict) and (kind := known_file(record)) is not None and kind.model == "ReplayResult":
        check_schema_version(_version_renamed(record), ReplayResult, where)


def load_results(path: str | Path, *, strict: bool = False, skipped: list[int] | None = None) -> list[ReplayResult]:
    """The results of a replay JSONL file, newest record per config key, in first-seen order.

    This is what calibration reads: each result carries the op, device name, dtype, median and
    spread in microseconds, and its status. ``skipped`` gets the numbers of the lines skipped
    (:func:`iter_results`).
    """
    by_key: dict[str, ReplayResult] = {}
    for r in iter_results(path, strict=strict, skipped=skipped):
        by_key.pop(r.key, None)
        by_key[r.key] = r
    return list(by_key.values())


_USE_INSTEAD = {
    "CollectiveMeasurement": "fit them with --collectives",
    "SequenceIssue": "give them to --issue",
}
"""What to do with a file of another replay output than results (by its model in the table of known files)."""


def describe_file(path: str | Path) -> str:
    """What a file that holds no replay result is, in a few words (``an op graph (`opgraph capture`)``,
    ``collective measurements ...``, ``not JSON lines``), for an error that names it; ``"an empty
    file"`` when it has nothing in it."""
    import gzip
    import json
    import zlib

    data = Path(path).read_bytes()
    packed = data[:2] == b"\x1f\x8b"
    if packed:
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error):
            return "gzip data that does not decompress"
    suffix = ", gzip-compressed" if packed else ""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data, not JSON lines"
    if not text.strip():
        return "an empty file"
    lines = False
    try:
        record = json.loads(text)  # one JSON document (or a single line)
    except json.JSONDecodeError:
        lines = True
        try:
            record = json.loads(next(line for line in text.split("\n") if line.strip()))
        except json.JSONDecodeError:
            return f"not JSON lines (its first line is not JSON){suffix}"
    known = known_file(record) if isinstance(record, dict) else None
    if known is not None and known.model == "ReplayResult":
        return f"replay results none of which this opgraph can read{suffix}"
    if known is not None and known.model in _USE_INSTEAD:
        return known.describe(_USE_INSTEAD[known.model]) + suffix
    kind = describe_json(record)
    return (f"JSON lines of {kind}, not replay results" if lines else kind) + suffix


def done_keys(paths: Iterable[str | Path]) -> set[str]:
    """Config keys already recorded in any of ``paths`` (missing files are ignored), for ``--resume``."""
    keys: set[str] = set()
    for p in paths:
        if Path(p).exists():
            keys.update(r.key for r in iter_results(p))
    return keys


class Coverage(FrozenModel):
    """How much of the model was replayed: by configs, by uses and by estimated time share."""

    configs: int
    """Unique configs."""
    replayed: int
    """Configs that ran and were timed (ok or mismatch)."""
    by_status: dict[str, int]
    """Configs per status."""
    uses: int
    """Op instances in the model(s) (sum of counts)."""
    uses_replayed: int
    """Op instances whose config was replayed."""
    share_replayed: float | None
    """Estimated model time replayed, 0..1 (``None`` without estimates)."""
    measured_us: float
    """Sum over replayed configs of count x median: the model's replayed op time."""
    reasons: dict[str, int] = Field(default_factory=dict)
    """Configs not replayed, by reason (shortened)."""

    @property
    def explained(self) -> int:
        """Configs replayed or given a reason (all of them, when nothing was lost)."""
        return sum(self.by_status.values())

    def line(self) -> str:
        """The one-line coverage summary the CLI prints."""
        parts = [f"coverage: {self.replayed}/{self.configs} configs replayed"]
        if self.configs:
            parts[0] += f" ({100 * self.replayed / self.configs:.1f}%)"
        parts.append(f"{self.uses_replayed}/{self.uses} op uses")
        if self.share_replayed is not None:
            parts.append(f"{100 * self.share_replayed:.2f}% of estimated op time")
        if self.by_status:
            parts.append(", ".join(f"{k} {v}" for k, v in sorted(self.by_status.items())))
        parts.append(f"replayed op time {self.measured_us / 1e3:.3f} ms")
        return "; ".join(parts)


def coverage(results: Iterable[ReplayResult]) -> Coverage:
    """The coverage summary of a set of results (one per config)."""
    rs = list(results)
    by_status: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for r in rs:
        by_status[r.status.value] = by_status.get(r.status.value, 0) + 1
        if not r.replayed:
            short = r.reason.split(":")[0][:60] if r.reason else r.status.value
            reasons[short] = reasons.get(short, 0) + 1
    replayed = [r for r in rs if r.replayed]
    have_share = [r for r in rs if r.share is not None]
    share: float | None = None
    if have_share:
        total = sum(r.share or 0.0 for r in have_share)
        share = sum(r.share or 0.0 for r in have_share if r.replayed) / total if total > 0 else None
    return Coverage(
        configs=len(rs),
        replayed=len(replayed),
        by_status=by_status,
        uses=sum(r.count for r in rs),
        uses_replayed=sum(r.count for r in replayed),
        share_replayed=share,
        measured_us=sum(r.count * (r.median_us or 0.0) for r in replayed),
        reasons=reasons,
    )


class RunToRun(FrozenModel):
    """Agreement of the medians of two replays of the same configs."""

    configs: int
    """Configs timed in both runs and at least ``min_us`` long."""
    common: int | None = None
    """Configs timed in both runs, of any length (``None`` in records written before it was kept)."""
    min_us: float
    """Shortest median considered."""
    median_rel: float
    """Median of ``|a - b| / mean(a, b)``."""
    p95_rel: float
    """95th percentile of the same."""
    max_rel: float
    """Largest of the same."""
    worst: str = ""
    """Definition of the config with the largest difference."""
    over_2pct: int = 0
    """Configs whose medians differ by more than 2%."""
    clock_median_rel: float | None = None
    """Median of ``|clock a - clock b| / mean`` of the SM clocks, over configs with clocks in both runs."""
    worst_clocks_mhz: tuple[float, float] | None = None
    """SM clocks of the worst config in the two runs, when both recorded one."""

    def line(self) -> str:
        """One line for the CLI (that there is nothing to compare, when no config is in both runs)."""
        if not self.configs:
            if not self.common:
                return "run-to-run: no config timed in both runs: nothing to compare with the baseline"
            return (
                f"run-to-run: {self.common} config(s) timed in both runs, none over {self.min_us:g} us: "
                "nothing to compare with the baseline"
            )
        return (
            f"run-to-run: {self.configs} configs over {self.min_us:g} us; |Δmedian| median "
            f"{100 * self.median_rel:.2f}%, p95 {100 * self.p95_rel:.2f}%, max {100 * self.max_rel:.2f}% "
            f"({self.worst}); {self.over_2pct} over 2%"
            + (f"; |Δclock| median {100 * self.clock_median_rel:.2f}%" if self.clock_median_rel is not None else "")
            + (
                f", worst at {self.worst_clocks_mhz[0]:.0f} vs {self.worst_clocks_mhz[1]:.0f} MHz"
                if self.worst_clocks_mhz is not None
                else ""
            )
        )


def run_to_run(a: Iterable[ReplayResult], b: Iterable[ReplayResult], *, min_us: float = 20.0) -> RunToRun:
    """Compare the medians of two runs config by config (only configs timed in both, over ``min_us``)."""
    first = {r.key: r for r in a if r.timing is not None}
    diffs: list[tuple[float, str, tuple[float, float] | None]] = []
    clock_rel: list[float] = []
    common = 0
    for r in b:
        other = first.get(r.key)
        if r.timing is None or other is None or other.timing is None:
            continue
        common += 1
        ma, mb = other.timing.median_us, r.timing.median_us
        if min(ma, mb) < min_us:
            continue
        ca, cb = other.timing.sm_clock_mhz, r.timing.sm_clock_mhz
        clocks = (ca, cb) if ca is not None and cb is not None else None
        if clocks is not None and ca and cb:
            clock_rel.append(abs(ca - cb) / ((ca + cb) / 2))
        diffs.append((abs(ma - mb) / ((ma + mb) / 2), r.definition, clocks))
    if not diffs:
        return RunToRun(configs=0, common=common, min_us=min_us, median_rel=0.0, p95_rel=0.0, max_rel=0.0)
    rel = sorted(d for d, _, _ in diffs)
    worst = max(diffs, key=lambda d: d[0])
    p95 = rel[min(len(rel) - 1, math.ceil(0.95 * len(rel)) - 1)]
    return RunToRun(
        configs=len(rel),
        common=common,
        min_us=min_us,
        median_rel=statistics.median(rel),
        p95_rel=p95,
        max_rel=worst[0],
        worst=worst[1],
        over_2pct=sum(1 for d in rel if d > 0.02),
        clock_median_rel=statistics.median(clock_rel) if clock_rel else None,
        worst_clocks_mhz=worst[2],
    )
