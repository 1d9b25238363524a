"""Measured tensor-parallel run: an HF causal LM with random weights, sharded over the ranks of a torchrun job.

Run from the repo root on a machine with N GPUs (one process per GPU):

    python3 -m torch.distributed.run --standalone --nproc-per-node 4 benchmarks/gpu/tp_run.py \\
        --model llama-3.1-8b --phases prefill,decode --out $OUT/tp/llama8b_tp4

Every rank builds the same model from opgraph's preset config (no download; seeded random bf16
weights, HF eager modules with SDPA, ``--layers`` cuts the depth), then keeps its shard. The
sharding is opgraph's own (``opgraph.transforms.DEFAULT_LINEAR_RULES``, the rules ``simulate --tp``
shards graphs with), applied to the HF modules, Megatron-style as transformers' ``tp_plan="auto"``
does for Llama: q/k/v and gate/up column-parallel, o_proj and down_proj row-parallel with an
all-reduce of their output, lm_head split over the vocabulary with an all-gather of the logits, the
embedding replicated (``--embedding vocab_parallel``: split, masked lookup and an all-reduce).

Phases are opgraph's capture phases (``opgraph.capture.api``): ``prefill`` (``--batch``,
``--seq-len``) and ``decode`` (``--decode-batch``, ``--kv-len``: one token on a KV cache filled with
``kv-len`` tokens outside the timing). Per phase: warm-up, wall time per step without the profiler
(median of ``--wall-repeats`` runs, every rank lined up before each: CUDA synchronize, then a
host barrier), then ``--profile-steps`` steps under torch.profiler with ``record_shapes``, each
lined up the same way, one trace per rank: ``<phase>.rank<r>.json.gz``. From each trace: GPU busy
time (union of kernel, memcpy and memset intervals), NCCL kernel time and compute time per step,
and every NCCL kernel's duration (``tp_predict.py`` splits them into transfer and wait over the
ranks). Rank 0 gathers every rank's numbers into ``summary.json`` (a ``TpRunSummary``) in
``--out``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gpu_cli import entry_point, parser  # noqa: E402
from pydantic import Field  # noqa: E402

from opgraph.ir import FrozenModel  # noqa: E402

STEP_RANGE = "opgraph.tp_step"
"""Profiler range around each profiled step."""


class TpCase(FrozenModel):
    """What one TP run measured: model, phase, shapes and how it was sharded."""

    model: str
    phase: str
    tp: int
    batch: int
    seq_len: int = 0
    """Prompt tokens (prefill)."""
    kv_len: int = 0
    """Tokens in the KV cache (decode)."""
    layers: int | None = None
    """Layers kept (``None``: all)."""
    dtype: str = "bf16"
    embedding: str = "replicated"
    lm_head: str = "vocab_parallel"

    @property
    def name(self) -> str:
        """A short name: ``llama-3.1-8b_decode_b8_kv2048_tp4``."""
        shape = f"s{self.seq_len}" if self.phase == "prefill" else f"kv{self.kv_len}"
        cut = f"_l{self.layers}" if self.layers else ""
        model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(self.model).name.removesuffix(".json"))
        return f"{model}{cut}_{self.phase}_b{self.batch}_{shape}_tp{self.tp}"


class TraceTimes(FrozenModel):
    """Device times of one rank's profiled steps, per step, from its trace."""

    steps: int
    gpu_busy_us: float
    """Union of kernel, memcpy and memset intervals, per step."""
    nccl_us: float
    """Sum of the NCCL kernels' durations, per step."""
    nccl_busy_us: float
    """Union of the NCCL kernel intervals, per step."""
    compute_busy_us: float
    """Union of the other device intervals, per step."""
    kernels: int
    """Device events per step."""
    nccl_kernels: int
    """NCCL kernels per step."""
    nccl_by_name: dict[str, float] = Field(default_factory=dict)
    """NCCL time per step by kernel family (``AllReduce``, ``AllGather``, ...)."""
    nccl_kernel_us: tuple[float, ...] = ()
    """Every NCCL kernel's duration, in start order, over all profiled steps (the i-th kernel of every
    rank is the same collective: their minimum over the ranks is its time without waiting for peers)."""
    collective_calls: dict[str, int] = Field(default_factory=dict)
    """c10d collective calls per step by kind (``all_reduce``: from ``c10d::allreduce_``), on any backend."""


class RankResult(FrozenModel):
    """One rank's numbers for one phase."""

    rank: int
    device_name: str
    wall_us: float
    """Median wall time of one step, microseconds (no profiler)."""
    wall_runs_us: tuple[float, ...]
    trace: TraceTimes | None = None
    trace_file: str = ""
    """The rank's profiler trace, relative to the summary's folder."""


class TpRun(FrozenModel):
    """One phase of one model at one TP degree, all ranks."""

    case: TpCase
    ranks: tuple[RankResult, ...]


class ShardCheck(FrozenModel):
    """Logits of the sharded model against the same model unsharded, on a few seeded tokens."""

    tokens: int
    max_abs_err: float
    ref_max_abs: float
    """Largest absolute logit of the unsharded model (the scale of the error)."""

    @property
    def rel_err(self) -> float:
        """``max_abs_err / ref_max_abs``."""
        return self.max_abs_err / self.ref_max_abs if self.ref_max_abs else self.max_abs_err


class TpRunSummary(FrozenModel):
    """Everything one ``tp_run.py`` job measured (``summary.json``)."""

    runs: tuple[TpRun, ...]
    check: ShardCheck | None = None
    """Rank 0's logits of the sharded model against the unsharded one (``--check``)."""
    torch_version: str = ""
    transformers_version: str = ""
    nccl_version: str = ""
    created: str = ""


# ---------------------------------------------------------------- sharding plan (no torch.distributed needed)
@dataclass(frozen=True)
class ShardSpec:
    """How one module is split: its module path, style (``column``, ``row``, ``vocab``, ``embedding``)."""

    name: str
    style: str


def tp_plan(model: Any, *, embedding: str = "replicated", lm_head: str = "vocab_parallel") -> list[ShardSpec]:
    """The modules of ``model`` to shard, by opgraph's linear rules (the ones ``simulate --tp`` uses).

    Each ``nn.Linear`` is matched by its module path as the capture records it in op scopes;
    replicated and unknown linears are left out. ``embedding="vocab_parallel"`` adds the
    ``nn.Embedding`` s.
    """
    import torch

    from opgraph.ir import Gemm
    from opgraph.transforms import ParallelStyle, linear_style

    plan: list[ShardSpec] = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Embedding):
            if embedding == "vocab_parallel":
                plan.append(ShardSpec(name, "embedding"))
            continue
        if not isinstance(mod, torch.nn.Linear):
            continue
        probe = Gemm(id=0, m=1, n=mod.out_features, k=mod.in_features, scope=name, target="aten.mm.default")
        rule = linear_style(probe)
        if rule is None or rule.moe_experts or rule.style is ParallelStyle.REPLICATED:
            continue
        if rule.style is ParallelStyle.VOCAB:
            if lm_head == "vocab_parallel":
                plan.append(ShardSpec(name, "vocab"))
            continue
        plan.append(ShardSpec(name, rule.style.value))
    return plan


def _head_dim(model: Any) -> int:
    cfg = model.config
    return int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)


def check_plan(model: Any, plan: Sequence[ShardSpec], tp: int) -> None:
    """Raise ``ValueError`` naming the module when ``tp`` does not divide what it splits (whole heads)."""
    mods = dict(model.named_modules())
    hd = _head_dim(model)
    for spec in plan:
        mod = mods[spec.name]
        if spec.style == "embedding":
            size, what = mod.num_embeddings, "vocabulary rows"
        elif spec.style == "row":
            size, what = mod.in_features, "input features"
        else:
            size, what = mod.out_features, "output features"
        if size % tp:
            raise ValueError(f"{spec.name}: {size} {what} do not split over {tp} ranks")
        attn_proj = spec.style == "column" and spec.name.split(".")[-1] in ("q_proj", "k_proj", "v_proj")
        if attn_proj and (size // hd) % tp:
            raise ValueError(f"{spec.name}: {size // hd} heads do not split over {tp} ranks")


def shard_model_(model: Any, plan: Sequence[ShardSpec], rank: int, tp: int, group: Any = None) -> list[Any]:
    """Keep rank ``rank``'s shard of every module of ``plan`` in place; returns the hooks installed.

    Column: output rows ``rank``-th chunk. Row: input columns; the output is all-reduced (a bias
    stays on rank 0). Vocab: rows; the logits are all-gathered along the last dimension.
    Embedding: rows, masked lookup, all-reduce.
    """
    import torch

    check_plan(model, plan, tp)
    mods = dict(model.named_modules())
    hooks: list[Any] = []
    with torch.no_grad():
        for spec in plan:
            mod = mods[spec.name]
            if spec.style == "embedding":
                _shard_embedding(mod, rank, tp, group)
                continue
            w = mod.weight
            if spec.style in ("column", "vocab"):
                n = w.shape[0] // tp
                mod.weight = torch.nn.Parameter(w[rank * n : (rank + 1) * n].clone(), requires_grad=False)
                if mod.bias is not None:
                    mod.bias = torch.nn.Parameter(mod.bias[rank * n : (rank + 1) * n].clone(), requires_grad=False)
                mod.out_features = n
                if spec.style == "vocab":
                    hooks.append(mod.register_forward_hook(_gather_last_dim(tp, group)))
            elif spec.style == "row":
                k = w.shape[1] // tp
                mod.weight = torch.nn.Parameter(w[:, rank * k : (rank + 1) * k].clone(), requires_grad=False)
                if mod.bias is not None and rank != 0:
                    mod.bias.zero_()
                mod.in_features = k
                hooks.append(mod.register_forward_hook(_all_reduce_output(group)))
            del w
    return hooks


def _all_reduce_output(group: Any) -> Callable[..., Any]:
    import torch.distributed as dist

    def hook(_mod: Any, _inp: Any, out: Any) -> Any:
        dist.all_reduce(out, group=group)
        return out

    return hook


def _gather_last_dim(tp: int, group: Any) -> Callable[..., Any]:
    import torch
    import torch.distributed as dist

    def hook(_mod: Any, _inp: Any, out: Any) -> Any:
        local = out.contiguous()
        # The ranks' shards stacked along dim 0 (the layout gloo insists on; NCCL takes it too).
        full = torch.empty((tp * local.shape[0], *local.shape[1:]), dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(full, local, group=group)
        return full.view(tp, *local.shape).movedim(0, -2).reshape(*local.shape[:-1], tp * local.shape[-1])

    return hook


def _shard_embedding(mod: Any, rank: int, tp: int, group: Any) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    rows = mod.num_embeddings // tp
    start = rank * rows
    mod.weight = torch.nn.Parameter(mod.weight[start : start + rows].clone(), requires_grad=False)
    mod.num_embeddings = rows
    pad = mod.padding_idx

    def forward(ids: Any) -> Any:
        outside = (ids < start) | (ids >= start + rows)
        local = (ids - start).masked_fill(outside, 0)
        out = F.embedding(local, mod.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0)
        if pad is not None:
            out = out.masked_fill((ids == pad).unsqueeze(-1), 0)
        dist.all_reduce(out, group=group)
        return out

    mod.forward = forward


# ---------------------------------------------------------------- trace reading (no torch needed)
def _nccl_family(name: str) -> str:
    low = name.lower()
    for fam in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "SendRecv", "AllToAll"):
        if fam.lower() in low:
            return fam
    return "other"


def c10d_kind(name: str) -> str | None:
    """The collective kind of a ``c10d::`` CPU op name (``c10d::allreduce_`` -> ``all_reduce``), or None."""
    if not name.startswith("c10d::"):
        return None
    low = name.lower()
    for key, kind in (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
                      ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("send", "send_recv"),
                      ("recv", "send_recv")):  # fmt: skip
        if key in low:
            return kind
    return None


def _step_correlations(events: Sequence[Any]) -> set[object] | None:
    """Correlation ids of the device work launched inside the :data:`STEP_RANGE` ranges of a trace;
    None when the trace has no such range (every device event then counts)."""
    steps = sorted(
        (float(e.get("ts", 0.0)), float(e.get("ts", 0.0)) + float(e.get("dur", 0.0)))
        for e in events
        if isinstance(e, dict)
        and e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
        and e.get("name") == STEP_RANGE
    )
    if not steps:
        return None
    from opgraph.trace.kineto import launch_times

    launches = launch_times(e for e in events if isinstance(e, dict))
    return {c for c, ts in launches.items() if any(a <= ts <= b for a, b in steps)}


def trace_times(path: str | Path, steps: int) -> TraceTimes:
    """Device times per step of a torch.profiler Chrome trace (``.json`` or ``.json.gz``)."""
    from opgraph.ir.timeline import union_length
    from opgraph.trace.kineto import is_device_event

    p = Path(path)
    opener: Any = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    launched = _step_correlations(events)
    dev: list[tuple[float, float]] = []
    nccl: list[tuple[float, float]] = []
    other: list[tuple[float, float]] = []
    by_name: dict[str, float] = {}
    calls: dict[str, int] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        if e.get("cat") == "cpu_op":
            kind = c10d_kind(str(e.get("name", "")))
            if kind is not None:
                calls[kind] = calls.get(kind, 0) + 1
            continue
        if not is_device_event(e):
            continue
        if launched is not None and (e.get("args") or {}).get("correlation") not in launched:
            continue  # launched between the steps (the decode cache's reset), not by a step
        ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        iv = (ts, ts + dur)
        dev.append(iv)
        name = str(e.get("name", ""))
        if e.get("cat") == "kernel" and "nccl" in name.lower():
            nccl.append(iv)
            fam = _nccl_family(name)
            by_name[fam] = by_name.get(fam, 0.0) + dur / steps
        else:
            other.append(iv)
    s = max(steps, 1)
    return TraceTimes(
        steps=s,
        gpu_busy_us=union_length(dev) / s,
        nccl_us=sum(b - a for a, b in nccl) / s,
        nccl_busy_us=union_length(nccl) / s,
        compute_busy_us=union_length(other) / s,
        kernels=round(len(dev) / s),
        nccl_kernels=round(len(nccl) / s),
        nccl_by_name=by_name,
        nccl_kernel_us=tuple(round(b - a, 3) for a, b in sorted(nccl)),
        collective_calls={k: round(v / s) for k, v in sorted(calls.items())},
    )


# ---------------------------------------------------------------- the run
def _contiguous_cache(cache: Any) -> None:
    """Make every key/value tensor of ``cache`` contiguous, in place.

    A cropped cache holds slices of the longer tensors, and a cache filled by a prefill can hold
    transposed views; ``torch.cat`` on such inputs takes its slow non-vectorised kernel (measured:
    5-10x slower for the KV-cache append), which a real generation loop never meets: there every
    cache tensor is the output of the previous step's ``cat``. Called outside the timed region.
    """
    for layer in getattr(cache, "layers", None) or ():  # transformers 5.x DynamicCache
        for attr in ("keys", "values"):
            t = getattr(layer, attr, None)
            if t is not None and hasattr(t, "is_contiguous") and not t.is_contiguous():
                setattr(layer, attr, t.contiguous())
    for attr in ("key_cache", "value_cache"):  # transformers 4.x
        tensors = getattr(cache, attr, None)
        if isinstance(tensors, list):
            tensors[:] = [t.contiguous() if hasattr(t, "contiguous") else t for t in tensors]


def _decode_cache_reset(cache: Any, kv_len: int) -> Callable[[], bool]:
    """A function that crops the decode cache back to ``kv_len`` tokens (contiguous, as in a real
    generation loop); False when it could not."""
    crop = getattr(cache, "crop", None)
    if crop is None:
        return lambda: False
    _contiguous_cache(cache)

    def reset() -> bool:
        extra = cache.get_seq_length() - kv_len
        if extra <= 0:
            return bool(extra == 0)
        # A negative argument removes that many tokens in every transformers version (the
        # argument was a length before it became a count of tokens to remove).
        crop(-extra)
        _contiguous_cache(cache)
        return bool(cache.get_seq_length() == kv_len)

    return reset


def measure_phase(
    prepared: Any,
    case: TpCase,
    *,
    device: str,
    rank: int,
    sync: Callable[[], None],
    out_dir: Path | None,
    warmup: int,
    wall_repeats: int,
    profile_steps: int,
    device_name: str,
) -> RankResult:
    """Warm up, time ``wall_repeats`` steps, profile ``profile_steps`` steps; this rank's result."""
    import torch

    from opgraph.capture.api import CaptureOptions, run_phase, setup_phase

    opts = CaptureOptions(
        phase=case.phase, batch=case.batch, seq_len=case.seq_len or 1, kv_len=case.kv_len or 1,
        dtype=case.dtype, layers=case.layers, device=device,
    )  # fmt: skip
    cuda = device == "cuda"

    def wait() -> None:
        if cuda:
            torch.cuda.synchronize()

    cache: Any = None
    reset: Callable[[], bool] = lambda: True  # noqa: E731
    if case.phase == "decode":
        cache = setup_phase(prepared, opts)
        reset = _decode_cache_reset(cache, case.kv_len)

    def step() -> None:
        nonlocal cache, reset
        run_phase(prepared, opts, None, cache)
        if cache is not None and not reset():
            cache = setup_phase(prepared, opts)  # no way to crop: fill a fresh cache (outside the timing)
            reset = _decode_cache_reset(cache, case.kv_len)

    with torch.no_grad():
        for _ in range(warmup):
            step()
        wait()
        walls: list[float] = []
        for _ in range(wall_repeats):
            wait()
            sync()
            t0 = time.perf_counter()
            run_phase(prepared, opts, None, cache)
            wait()
            walls.append((time.perf_counter() - t0) * 1e6)
            if cache is not None and not reset():
                cache = setup_phase(prepared, opts)
                reset = _decode_cache_reset(cache, case.kv_len)
        trace: TraceTimes | None = None
        trace_file = ""
        if profile_steps > 0 and out_dir is not None:
            from torch.profiler import ProfilerActivity, profile, record_function

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts, record_shapes=True) as prof:
                for _ in range(profile_steps):
                    # Every profiled step starts with the GPUs idle and the ranks lined up, as the
                    # timed steps do: what skew remains is the step's own (eager host launches).
                    wait()
                    sync()
                    with record_function(STEP_RANGE):
                        run_phase(prepared, opts, None, cache)
                    wait()
                    if cache is not None:
                        reset()
            trace_file = f"{case.phase}.rank{rank}.json.gz"
            out_dir.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(out_dir / trace_file))
            trace = trace_times(out_dir / trace_file, profile_steps)
    return RankResult(
        rank=rank,
        device_name=device_name,
        wall_us=statistics.median(walls) if walls else 0.0,
        wall_runs_us=tuple(round(w, 1) for w in walls),
        trace=trace,
        trace_file=trace_file,
    )


def build_sharded(
    model: str,
    case: TpCase,
    *,
    device: str,
    rank: int,
    tp: int,
    group: Any,
    seed: int = 0,
    check_tokens: int = 0,
) -> tuple[Any, ShardCheck | None]:
    """Every rank builds the same seeded model on ``device`` and keeps its shard.

    Returns the ``PreparedModel`` and, with ``check_tokens``, the sharded model's logits on that
    many seeded tokens against the unsharded model's (a sharding that computes something else
    must not be timed).
    """
    import torch

    from opgraph.capture.api import CaptureOptions, prepare

    torch.manual_seed(seed)
    opts = CaptureOptions(phase=case.phase, dtype=case.dtype, layers=case.layers, device=device, batch=case.batch,
                          seq_len=max(case.seq_len, 1), kv_len=max(case.kv_len, 1))  # fmt: skip
    prepared = prepare(model, opts)
    ids = None
    ref = None
    if check_tokens:
        vocab = int(prepared.config.vocab_size)
        gen = torch.Generator(device="cpu").manual_seed(3)
        ids = torch.randint(0, vocab, (1, check_tokens), generator=gen).to(device)
        with torch.no_grad():
            ref = prepared.model(input_ids=ids, use_cache=False).logits.float()
    plan = tp_plan(prepared.model, embedding=case.embedding, lm_head=case.lm_head)
    if tp > 1:
        shard_model_(prepared.model, plan, rank, tp, group)
    check = None
    if ids is not None and ref is not None:
        with torch.no_grad():
            got = prepared.model(input_ids=ids, use_cache=False).logits.float()
        check = ShardCheck(
            tokens=check_tokens,
            max_abs_err=float((got - ref).abs().max().item()),
            ref_max_abs=float(ref.abs().max().item()),
        )
        del got, ref
    if device == "cuda":
        torch.cuda.empty_cache()
    return prepared, check


def _versions() -> tuple[str, str, str]:
    import torch
    import transformers

    nccl = ""
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()  # type: ignore[no-untyped-call]
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:  # a build without NCCL
            nccl = ""
    return str(torch.__version__), str(transformers.__version__), nccl


def run(args: argparse.Namespace) -> TpRunSummary | None:
    """The whole job on this rank; rank 0 returns the gathered summary (others ``None``)."""
    import torch
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        torch.cuda.set_device(local)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    sync_group = None
    if world > 1:
        sync_group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else dist.group.WORLD

    def sync() -> None:
        if sync_group is not None:
            dist.barrier(group=sync_group)

    from validators.inputs import device_name as _dev_name

    dev_name = _dev_name(torch.device(device, local) if device == "cuda" else torch.device(device))
    out = Path(args.out)
    runs: list[TpRun] = []
    base = TpCase(model=args.model, phase="prefill", tp=world, batch=args.batch, seq_len=args.seq_len,
                  layers=args.layers, dtype=args.dtype, embedding=args.embedding)  # fmt: skip
    prepared, check = build_sharded(
        args.model, base, device=device, rank=rank, tp=world, group=None, check_tokens=args.check_tokens
    )
    if check is not None and rank == 0:
        print(f"shard check: max |logit error| {check.max_abs_err:.3g} of {check.ref_max_abs:.3g}", flush=True)
    for phase in args.phases:
        if phase == "prefill":
            case = base
        else:
            case = base.model_copy(update={"phase": "decode", "batch": args.decode_batch, "seq_len": 0,
                                           "kv_len": args.kv_len})  # fmt: skip
        t0 = time.perf_counter()
        res = measure_phase(
            prepared, case, device=device, rank=rank, sync=sync, out_dir=out, warmup=args.warmup,
            wall_repeats=args.wall_repeats, profile_steps=args.profile_steps, device_name=dev_name,
        )  # fmt: skip
        if device == "cuda":
            torch.cuda.empty_cache()
        results = [res]
        if world > 1:
            gathered: list[Any] = [None] * world if rank == 0 else []
            dist.gather_object(res.model_dump_json(), gathered if rank == 0 else None, dst=0, group=sync_group)
            results = [RankResult.model_validate_json(g) for g in gathered] if rank == 0 else []
        if rank == 0:
            runs.append(TpRun(case=case, ranks=tuple(results)))
            tr = res.trace
            busy = f" gpu {tr.gpu_busy_us / 1e3:.2f} ms, nccl {tr.nccl_us / 1e3:.2f} ms" if tr else ""
            print(f"{case.name}: wall {res.wall_us / 1e3:.2f} ms{busy} ({time.perf_counter() - t0:.0f} s)", flush=True)
    if world > 1:
        dist.barrier(group=sync_group)
        dist.destroy_process_group()
    if rank != 0:
        return None
    tv, trv, nv = _versions()
    summary = TpRunSummary(runs=tuple(runs), check=check, torch_version=tv, transformers_version=trv, nccl_version=nv,
                           created=datetime.now(UTC).isoformat(timespec="seconds"))  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(summary.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return summary


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = parser(__doc__)
    ap.add_argument("--model", default="llama-3.1-8b", help="an opgraph preset (or config.json)")
    ap.add_argument("--layers", type=int, default=None, help="keep this many layers")
    ap.add_argument("--phases", default="prefill,decode")
    ap.add_argument("--batch", type=int, default=1, help="prefill batch")
    ap.add_argument("--seq-len", type=int, default=2048, help="prefill tokens")
    ap.add_argument("--decode-batch", type=int, default=8)
    ap.add_argument("--kv-len", type=int, default=2048)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--embedding", choices=("replicated", "vocab_parallel"), default="replicated")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--wall-repeats", type=int, default=7)
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--check-tokens", type=int, default=16, help="check the sharded logits on N tokens (0: off)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(list(argv) if argv is not None else None)
    args.phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    bad = [p for p in args.phases if p not in ("prefill", "decode")]
    if bad:
        ap.error(f"--phases: unknown phase {bad[0]!r} (prefill, decode)")
    return args


main = entry_point(run, parse_args, "Entry point (under torchrun, or alone for TP 1).")

if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The run's files are written: skip the interpreter's teardown, where torch's profiler and gloo threads
    # have aborted a finished rank (std::terminate) on a loaded CPU.
    os._exit(status)
