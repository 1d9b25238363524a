"""Replay unique op configs on a device: build inputs, run, check against float64, time, measure energy.

:class:`Replayer` replays one config at a time and never lets a failing config stop the run: a
missing recipe is ``unsupported``, an out-of-memory ``oom``, an exception ``error`` with its reason.
Only a device left unusable (a sticky CUDA error) stops the run, after recording the config that
caused it, so ``--resume`` carries on past it in a fresh process.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opgraph.ir import OpBase, OpGraph, OpgraphError
from validators.configs import Estimator, OpConfig, config_key, cost_estimator, unique_configs
from validators.inputs import device_name, make_generator, match_inputs, resolve_device, routing_skew
from validators.numerics import check_case, reference_inputs
from validators.recipes import BuildContext, Case, RecipeSelector
from validators.results import (
    EnergyStats,
    NumericCheck,
    ReplayResult,
    ReplayStatus,
    ResultWriter,
    TimingStats,
    now_iso,
)
from validators.timing import CudaTimer, TimingConfig, synchronize, time_cpu

if TYPE_CHECKING:
    import torch


class DeviceLostError(OpgraphError):
    """The device is unusable after an op failed (a sticky CUDA error); the process must restart."""


@dataclass(frozen=True)
class ReplayOptions:
    """What replay measures and how hard it tries."""

    timing: TimingConfig = field(default_factory=TimingConfig)
    """Warm-up, samples and stopping rule."""
    check: bool = True
    """Compare outputs with a float64 reference."""
    reference_device: str = "cpu"
    """Where the float64 reference runs."""
    check_max_flops: float = 5e12
    """Ops above this many FLOPs get their float64 reference on the replay device instead (speed)."""
    energy: bool | None = None
    """Measure energy with NVML: True, False, or None for 'when available'."""
    energy_window_s: float = 0.3
    """Back-to-back window per config for energy."""
    seed: int = 0
    """Seed of the synthetic inputs (mixed with each config's key)."""
    moe_skew: float | None = None
    """MoE routing skew; ``None`` takes the graph's assumption."""
    recipes: dict[str, str] = field(default_factory=dict)
    """Recipe overrides: op target or definition to a recipe name or ``pkg.module:Class``."""
    sm_clock: bool = True
    """Sample the SM clock with NVML while each config is timed (CUDA, where NVML is available)."""
    warm_l2_fraction: float = 0.5
    """Share of the L2 an activation (its reuse distance plus its size) must fit in to be read back
    warm: a stream keeps about half of an H100's two-partition L2 near."""
    dirty_l2_fraction: float = 0.5
    """With a cold L2 and warm activations: the most of the L2 left dirty before each call (the
    bytes the op before wrote, :attr:`OpConfig.prev_write_bytes`, up to this share of it)."""
    warm_aux_bytes: int = 1 << 20
    """With a cold L2 and warm activations: recipe-built tensors that stand for no recorded input
    (offsets, positions, small masks) up to this size are read into L2 too (the model makes them
    just before the op)."""
    issue_in_sequence: bool = True
    """On CUDA, time each config's host issue time with every op of the graphs called in their
    order (:mod:`validators.sequence`), as a model run issues it, instead of in a burst of
    calls of that op alone."""


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:400]


def _is_oom(exc: BaseException) -> bool:
    import torch

    oom_type = getattr(torch.cuda, "OutOfMemoryError", None) or getattr(torch, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    if isinstance(exc, MemoryError):
        return True
    msg = str(exc).lower()
    return "out of memory" in msg or "can't allocate memory" in msg or "failed to allocate" in msg


class Replayer:
    """Replays configs on one device, reusing its timer, energy meter and recipes across configs."""

    def __init__(self, device: str = "cpu", options: ReplayOptions | None = None, *, rank: int = 0) -> None:
        import torch

        self.options = options or ReplayOptions()
        self.device: torch.device = resolve_device(device)
        if self.options.check and self.options.reference_device != "cpu":
            resolve_device(self.options.reference_device)
        self.device_label = str(self.device)
        self.device_name = device_name(self.device)
        self.torch_version = str(torch.__version__)
        self.rank = rank
        self.selector = RecipeSelector(dict(self.options.recipes))
        self.sequence_issue_us: dict[str, float] = {}
        """Host issue time per config key timed in the graphs' op order
        (:func:`validators.sequence.issue_in_sequence`); it replaces the isolated burst's."""
        self._timer = CudaTimer(self.device) if self.device.type == "cuda" else None
        self._energy: Any = None
        self._nvml: Any = None
        self.energy_note = ""
        want_energy = self.options.energy is not False
        if self.device.type == "cuda" and (want_energy or self.options.sm_clock):
            from validators.energy import EnergyMeter

            meter = EnergyMeter(self.device)
            if meter.available:
                self._nvml = meter
                if want_energy:
                    meter.measure_idle()
                    self._energy = meter
            elif want_energy:
                self.energy_note = meter.why
        elif self.options.energy:
            self.energy_note = "energy needs a CUDA device with NVML"

    def close(self) -> None:
        """Release NVML."""
        if self._nvml is not None:
            self._nvml.close()

    def _result(
        self, cfg: OpConfig, status: ReplayStatus, reason: str = "", recipe: str = "", **extra: Any
    ) -> ReplayResult:
        op = cfg.op
        return ReplayResult(
            key=cfg.key,
            definition=op.definition,
            kind=op.kind,
            target=op.target,
            dtype=op.dtype,
            op=op,
            count=max(cfg.count, 1),
            share=cfg.share,
            est_us=cfg.est_us,
            graphs=tuple(cfg.graphs),
            recipe=recipe,
            status=status,
            reason=reason,
            device=self.device_label,
            device_name=self.device_name,
            torch_version=self.torch_version,
            rank=self.rank,
            created=now_iso(),
            **extra,
        )

    def _generator_seed(self, key: str) -> int:
        return (self.options.seed * 1_000_003 + int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)) % (2**63)

    def _context(self, cfg: OpConfig, moe_skew: float) -> BuildContext:
        skew = self.options.moe_skew if self.options.moe_skew is not None else moe_skew
        return BuildContext(self.device, make_generator(self.device, self._generator_seed(cfg.key)), skew)

    def build_case(self, cfg: OpConfig, *, moe_skew: float = 0.0) -> Case | None:
        """The config's case as :meth:`replay` builds it (same recipe, seed and inputs); ``None``
        when no recipe takes it or the build fails."""
        recipe = self.selector.select(cfg.op).recipe
        if recipe is None:
            return None
        try:
            return recipe.build(cfg.op, self._context(cfg, moe_skew))
        except Exception:
            return None

    def replay(self, cfg: OpConfig, *, moe_skew: float = 0.0) -> ReplayResult:
        """Replay one config: never raises for the op's own failures (only :class:`DeviceLostError`)."""
        op = cfg.op
        sel = self.selector.select(op)
        if sel.recipe is None:
            status = ReplayStatus.SKIPPED if sel.skipped else ReplayStatus.UNSUPPORTED
            return self._result(cfg, status, sel.reason or f"no replay recipe for {op.target or op.definition}")
        recipe = sel.recipe
        stage = "build"
        case: Case | None = None
        try:
            case = recipe.build(op, self._context(cfg, moe_skew))
            numerics: NumericCheck | None = None
            if self.options.check:
                stage = "check"
                numerics = self._check(case, op)
            stage = "time"
            timing = self._time(case, cfg)
            energy: EnergyStats | None = None
            if self._energy is not None:
                stage = "energy"
                energy = self._energy.measure(case, lambda: synchronize(self.device), self.options.energy_window_s)
        except Exception as exc:
            del case
            return self._failure(cfg, exc, stage, recipe.name)
        del case
        if numerics is not None and not numerics.ok:
            return self._result(
                cfg, ReplayStatus.MISMATCH, f"mismatch: {numerics.note}", recipe.name,
                timing=timing, numerics=numerics, energy=energy,
            )  # fmt: skip
        return self._result(cfg, ReplayStatus.OK, "", recipe.name, timing=timing, numerics=numerics, energy=energy)

    def _failure(self, cfg: OpConfig, exc: BaseException, stage: str, recipe: str) -> ReplayResult:
        import torch

        oom = _is_oom(exc)
        gc.collect()
        if self.device.type == "cuda":
            try:
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
            except Exception as sticky:
                result = self._result(cfg, ReplayStatus.ERROR, f"{stage}: {_reason(exc)}", recipe)
                raise DeviceLostError(
                    f"the device is unusable after {cfg.definition} failed ({_reason(sticky)[:160]})",
                    where=cfg.key,
                    hint="rerun with --resume: the failed config is recorded and will be skipped",
                ) from _Carry(result)
        status = ReplayStatus.OOM if oom else ReplayStatus.ERROR
        return self._result(cfg, status, f"{stage}: {_reason(exc)}", recipe)

    def _check(self, case: Case, op: OpBase) -> NumericCheck:
        ref_dev_name = self.options.reference_device
        if op.flops > self.options.check_max_flops:
            ref_dev_name = str(self.device)
        import torch

        ref_dev = torch.device(ref_dev_name)
        ref_in = reference_inputs(case.inputs, ref_dev)
        out = case()
        synchronize(self.device)
        result = check_case(case, op, out, ref_in, ref_dev_name)
        del ref_in, out
        return result

    def _time(self, case: Case, cfg: OpConfig) -> TimingStats:
        timing = self.options.timing
        if self._timer is None:
            return time_cpu(case, timing)
        warm_idx: tuple[int, ...] | None = None
        warm: list[Any] = []
        dirty: int | None = None
        if timing.cold_l2 and timing.warm_activations:
            warm_idx, warm = self.warm_tensors(case, cfg, self._timer.l2_bytes)
            dirty = int(min(cfg.prev_write_bytes, self._timer.l2_bytes * self.options.dirty_l2_fraction))
        sampler = self._nvml.clock_sampler() if (self._nvml is not None and self.options.sm_clock) else None
        if sampler is None:
            stats = self._timer.time(case, timing, warm=warm, dirty_bytes=dirty or 0)
        else:
            with sampler:
                stats = self._timer.time(case, timing, warm=warm, dirty_bytes=dirty or 0, busy=sampler)
        update: dict[str, Any] = {
            "warm_inputs": warm_idx,
            "dirty_l2_bytes": dirty,
            "sm_clock_mhz": sampler.median if sampler is not None else None,
        }
        if cfg.key in self.sequence_issue_us:
            update |= {"host_us": self.sequence_issue_us[cfg.key], "host_burst_us": stats.host_us}
        return stats.model_copy(update=update)

    def warm_tensors(self, case: Case, cfg: OpConfig, l2_bytes: int) -> tuple[tuple[int, ...], list[Any]]:
        """The op inputs to read into L2 after a flush (indices into the op's inputs) and the tensors.

        Those are the config's activation inputs (``cfg.warm_inputs``) whose reuse distance plus
        their own size fits in ``options.warm_l2_fraction`` of ``l2_bytes`` (an activation written
        long ago, with more than the L2 moved since, or too big to stay there, is cold in the model
        too), found among the case's tensors by :func:`match_inputs`; plus case
        tensors that stand for no recorded input, up to ``options.warm_aux_bytes`` each.
        """
        import torch

        reuse = cfg.warm_reuse_bytes if len(cfg.warm_reuse_bytes) == len(cfg.warm_inputs) else ()
        room = l2_bytes * self.options.warm_l2_fraction
        wanted = [
            i
            for n, i in enumerate(cfg.warm_inputs)
            if (reuse[n] if reuse else 0) + (cfg.op.inputs[i].nbytes if i < len(cfg.op.inputs) else 0) <= room
        ]
        where = match_inputs(case.inputs, cfg.op.inputs)
        idx: list[int] = []
        tensors: list[Any] = []
        for i in wanted:
            pos = where[i] if 0 <= i < len(where) else None
            if pos is not None:
                idx.append(i)
                tensors.append(case.inputs[pos])
        claimed = {p for p in where if p is not None}
        for pos, v in enumerate(case.inputs):
            small = isinstance(v, torch.Tensor) and v.numel() * v.element_size() <= self.options.warm_aux_bytes
            if pos not in claimed and small:
                tensors.append(v)
        return tuple(idx), tensors


class _Carry(Exception):
    """Carries the result of the config that broke the device to whoever records results."""

    def __init__(self, result: ReplayResult) -> None:
        super().__init__("result of the failing config")
        self.result = result


def lost_device_result(exc: DeviceLostError) -> ReplayResult | None:
    """The recorded result of the config that made the device unusable (to write before stopping)."""
    cause = exc.__cause__
    return cause.result if isinstance(cause, _Carry) else None


def replay_configs(
    configs: Iterable[OpConfig],
    device: str = "cpu",
    options: ReplayOptions | None = None,
    *,
    writer: ResultWriter | None = None,
    skip: set[str] | None = None,
    moe_skew: float = 0.0,
    rank: int = 0,
    replayer: Replayer | None = None,
) -> Iterator[ReplayResult]:
    """Replay configs in order, streaming each result to ``writer`` (flushed) before yielding it.

    Configs whose key is in ``skip`` (done in an earlier run) are not replayed.
    """
    rep = replayer or Replayer(device, options, rank=rank)
    try:
        for cfg in configs:
            if skip and cfg.key in skip:
                continue
            try:
                result = rep.replay(cfg, moe_skew=moe_skew)
            except DeviceLostError as exc:
                lost = lost_device_result(exc)
                if lost is not None and writer is not None:
                    writer.write(lost)
                raise
            if writer is not None:
                writer.write(result)
            yield result
    finally:
        if replayer is None:
            rep.close()


def graph_skew(graphs: Iterable[OpGraph]) -> float:
    """The MoE routing skew the graphs assumed (the largest, 0 when all are balanced)."""
    skews = [routing_skew(g.metadata.assumptions, dict(g.metadata.capture)) for g in graphs]
    return max(skews, default=0.0)


def replay_graph(
    graph: OpGraph | Iterable[OpGraph],
    device: str = "cpu",
    options: ReplayOptions | None = None,
    *,
    estimate: Estimator | None = None,
    writer: ResultWriter | None = None,
    select: Callable[[OpConfig], bool] | None = None,
) -> Iterator[ReplayResult]:
    """Replay every unique config of one or many graphs, most expensive first; yields as measured.

    ``estimate`` (seconds of one call) weights configs for the time share; by default the hardware
    roofline on a catalog GPU (:func:`~validators.configs.cost_estimator`).
    """
    graphs = [graph] if isinstance(graph, OpGraph) else list(graph)
    configs = unique_configs(graphs, estimate=estimate or cost_estimator())
    if select is not None:
        configs = [c for c in configs if select(c)]
    yield from replay_configs(configs, device, options, writer=writer, moe_skew=graph_skew(graphs))


def replay_op(
    op: OpBase, device: str = "cpu", options: ReplayOptions | None = None, *, warm_inputs: tuple[int, ...] = ()
) -> ReplayResult:
    """Replay a single op (its own config, count 1) and return the result.

    ``warm_inputs``: indices of the op's inputs that are activations (read into L2 after a flush).
    """
    cfg = OpConfig(key=config_key(op), op=op, count=1, op_ids=[op.id], warm_inputs=warm_inputs)
    rep = Replayer(device, options)
    try:
        return rep.replay(cfg)
    finally:
        rep.close()
