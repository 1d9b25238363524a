"""Measure HF ``generate`` on a GPU: total time and per-forward (per-step) times (issue 20's validation).

Every case's model is built first (random weights from a preset config, bf16, SDPA, cut to a few layers,
optionally with config overrides or a variant) and warmed up. Then ``--rounds`` rounds run every case
once each: a plain ``generate`` (``min_new_tokens = max_new_tokens = N``, greedy) timed end to end
(CUDA-synchronised wall), then one timed per forward by forward pre/post hooks: host clocks (when each
forward starts and ends, when ``generate`` was called and returned) and CUDA events (device time from
the pre-hook's event to the post-hook's, no synchronisation inside the loop).

The host of a shared GPU machine drifts in speed (up to 2x within minutes), so measuring the cases one
after the other compares host states, not cases: the first run measured Qwen2.5-7B 41% slower than its
simulation because the host slowed during that case. The rounds rotate the order (and reverse it every
other round), each round starts with a host probe (the host time of tiny kernel launches and of a
pure-Python loop), and each case reports the median wall, the fastest wall and per-forward medians over
its hooked runs. Per case the script also counts the host-device synchronisations of one ``generate``
(``torch.cuda.set_sync_debug_mode``), and with ``--profile NAME,...`` writes a torch-profiler trace of one
``generate`` of those cases (forwards marked ``opgraph_forward_<i>``).

The CPU side (``benchmarks/generate_validate_report.py``) captures each generation on meta (from the
case's exact config) and compares total and per-step times.

    python3 benchmarks/gpu/generate_validate.py --out "$OUT/generate_validate.json" --profile qwen25_7b_b4_p256_n24

``--smoke`` runs every case on the CPU with tiny dimensions (a test of the script, not a measurement).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import shutil
import statistics
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from heldout import host_probe, round_order, sync
from make_traces import Case, build_config

QWEN_DIMS = {
    # Qwen2.5-7B's shapes on another architecture: tells the shapes' cost from the architecture's.
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 152064,
}
SMOKE_DIMS = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "eos_token_id": 511,
    "bos_token_id": 510,
}


@dataclass(frozen=True)
class GenCase:
    """One measured generation."""

    name: str
    preset: str
    layers: int
    batch: int
    prompt: int
    new: int
    overrides: dict[str, Any] = field(default_factory=dict)
    variant: str = ""
    """``no_qkv_bias``: the attention projections' biases removed after building (a plain matmul each)."""
    role: str = "validate"
    """``validate``: a case the prediction is judged on; ``control``: a diagnostic twin of one;
    ``train``: a case the host profile's generation terms may be fitted on (other models, shapes and
    depths than every validated case)."""


CASES = [
    GenCase("llama1b_b1_p128_n32", "llama-3.2-1b", 4, 1, 128, 32),
    GenCase("llama8b_b8_p512_n32", "llama-3.1-8b", 2, 8, 512, 32),
    GenCase("qwen25_7b_b4_p256_n24", "qwen2.5-7b", 2, 4, 256, 24),
    # Controls for the Qwen case: Llama-3.1-8B at its batch and lengths, Llama with its shapes, Qwen
    # without the q/k/v biases (addmm -> mm).
    GenCase("llama8b_b4_p256_n24", "llama-3.1-8b", 2, 4, 256, 24, role="control"),
    GenCase("llama_qwendims_b4_p256_n24", "llama-3.1-8b", 2, 4, 256, 24, overrides=QWEN_DIMS, role="control"),
    GenCase("qwen25_7b_noqkvbias_b4_p256_n24", "qwen2.5-7b", 2, 4, 256, 24, variant="no_qkv_bias", role="control"),
]
CASES += [
    # Training generations for the host profile: 1 or 3 layers (the validated cases have 2 or 4), other
    # batches and lengths.
    GenCase("train_llama1b_b4_p256_n24_l3", "llama-3.2-1b", 3, 4, 256, 24, role="train"),
    GenCase("train_llama1b_b16_p64_n24_l1", "llama-3.2-1b", 1, 16, 64, 24, role="train"),
    GenCase("train_llama8b_b16_p128_n24_l1", "llama-3.1-8b", 1, 16, 128, 24, role="train"),
    GenCase("train_llama8b_b2_p1024_n16_l3", "llama-3.1-8b", 3, 2, 1024, 16, role="train"),
    GenCase("train_qwen25_7b_b1_p512_n24_l3", "qwen2.5-7b", 3, 1, 512, 24, role="train"),
]


def build(case: GenCase, device: str, smoke: bool) -> tuple[Any, Any]:
    """The case's config and model (random weights, bf16 on CUDA, fp32 for the CPU smoke run)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    overrides = {**case.overrides, **(SMOKE_DIMS if smoke else {})}
    config = build_config(
        Case(
            case.name,
            case.preset,
            case.layers,
            "generate",
            batch=case.batch,
            seq_len=case.prompt,
            new_tokens=case.new,
            overrides=overrides,
        )
    )
    dtype = torch.float32 if smoke else torch.bfloat16
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    if case.variant == "no_qkv_bias":
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias = None
    elif case.variant:
        raise ValueError(f"unknown variant {case.variant!r}")
    return config, model


def count_syncs(run: Any, device: str) -> int | None:
    """Host-device synchronisations in one ``run()`` (CUDA's sync debug mode warns once per sync)."""
    import torch

    if device != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run()
            torch.cuda.synchronize()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(1 for w in caught if "synchroniz" in str(w.message).lower())


class ForwardClock:
    """Forward pre/post hooks: host clocks of each forward, CUDA events, profiler marks (optional)."""

    def __init__(self, cuda: bool, mark: bool) -> None:
        self.cuda, self.mark = cuda, mark
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.events: list[list[Any]] = []
        self._marks: list[Any] = []

    def pre(self, *_: Any) -> None:
        """Before a forward: its start on the host, an event, a profiler range."""
        import torch

        self.starts.append(time.perf_counter())
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events.append([e, None])
        if self.mark:
            rf = torch.profiler.record_function(f"opgraph_forward_{len(self.starts) - 1}")
            rf.__enter__()
            self._marks.append(rf)

    def post(self, *_: Any) -> None:
        """After a forward: close its range, an event, its end on the host."""
        import torch

        if self._marks:
            self._marks.pop().__exit__(None, None, None)
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.events[-1][1] = e
        self.ends.append(time.perf_counter())

    def record(self, model: Any, run: Any, device: str) -> tuple[float, float]:
        """Run ``run()`` with the hooks on ``model``: (when it was called, when it returned, synchronised)."""
        h1, h2 = model.register_forward_pre_hook(self.pre), model.register_forward_hook(self.post)
        try:
            t_begin = time.perf_counter()
            run()
            sync(device)
            return t_begin, time.perf_counter()
        finally:
            h1.remove()
            h2.remove()

    def summary(self, t_begin: float, t_end: float) -> dict[str, Any]:
        """Per-forward times of the recorded run."""
        starts, ends = self.starts, self.ends
        out: dict[str, Any] = {
            "forwards": len(starts),
            "hooked_wall_us": (t_end - t_begin) * 1e6,
            "setup_us": (starts[0] - t_begin) * 1e6,
            # Wall per forward: from its start to the next one's (the last: to generate's return).
            "step_wall_us": [(b - a) * 1e6 for a, b in zip(starts, [*starts[1:], t_end], strict=True)],
            # Host time inside each forward (its pre-hook to its post-hook).
            "step_host_us": [(b - a) * 1e6 for a, b in zip(starts, ends, strict=True)],
        }
        if self.events:
            out["step_device_us"] = [a.elapsed_time(b) * 1e3 for a, b in self.events]
        return out


def profiled(model: Any, run: Any, device: str, trace: Path) -> None:
    """One ``run()`` under torch.profiler, forwards marked, written to ``trace`` (.json.gz)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    clock = ForwardClock(cuda=False, mark=True)
    with profile(activities=acts) as prof:
        clock.record(model, run, device)
    raw = trace.with_suffix("")  # name.json
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(trace, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()


@dataclass
class Prepared:
    """A case's model built and warmed up, ready to run ``generate``."""

    case: GenCase
    config: Any
    model: Any
    run: Any
    walls: list[float] = field(default_factory=list)
    hooked: list[dict[str, Any]] = field(default_factory=list)


def prepare(case: GenCase, device: str, smoke: bool) -> Prepared:
    """Build ``case``'s model and warm its ``generate`` up (two runs)."""
    import torch

    config, model = build(case, device, smoke)
    vocab = int(getattr(config, "vocab_size", 32000))
    ids = torch.randint(0, vocab, (case.batch, case.prompt), device=device)
    # generate as a user calls it (greedy, the model's own stopping criteria: what `opgraph capture
    # --phase generate` models); random weights all but never emit EOS in every row, checked below.
    kwargs = {"max_new_tokens": case.new, "do_sample": False}

    def run() -> None:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        if out.shape[1] != case.prompt + case.new:
            raise RuntimeError(f"{case.name}: generate stopped after {out.shape[1] - case.prompt} of {case.new} tokens")

    for _ in range(2):
        run()
    sync(device)
    return Prepared(case, config, model, run)


def one_round(prepared: Sequence[Prepared], device: str) -> None:
    """Each case once in the given order: a plain timed ``generate``, then one timed per forward."""
    for p in prepared:
        t0 = time.perf_counter()
        p.run()
        sync(device)
        p.walls.append((time.perf_counter() - t0) * 1e6)
        clock = ForwardClock(cuda=device == "cuda", mark=False)
        p.hooked.append(clock.summary(*clock.record(p.model, p.run, device)))


def step_medians(hooked: Sequence[dict[str, Any]], key: str) -> list[float]:
    """Per forward, the median over the hooked runs of ``key`` (a per-forward list)."""
    runs = [h[key] for h in hooked if key in h]
    if not runs:
        return []
    n = min(len(r) for r in runs)
    return [statistics.median(r[i] for r in runs) for i in range(n)]


def case_row(p: Prepared, device: str, trace: Path | None, smoke: bool = False) -> dict[str, Any]:
    """A case's measurements: walls, per-forward medians over the hooked runs (and the runs), syncs."""
    c = p.case
    hooked = [{k: [round(x, 1) for x in v] if isinstance(v, list) else v for k, v in h.items()} for h in p.hooked]
    out: dict[str, Any] = {
        "case": c.name,
        "preset": c.preset,
        "layers": c.layers,
        "batch": c.batch,
        "prompt": c.prompt,
        "new_tokens": c.new,
        "overrides": {**c.overrides, **(SMOKE_DIMS if smoke else {})},
        "variant": c.variant,
        "role": c.role,
        "config": p.config.to_dict(),
        "syncs_per_generate": count_syncs(p.run, device),
        "wall_us": {"median": statistics.median(p.walls), "min": min(p.walls), "runs": p.walls},
        "forwards": hooked[0]["forwards"],
        "setup_us": statistics.median(h["setup_us"] for h in hooked),
        "step_wall_us": step_medians(hooked, "step_wall_us"),
        "step_host_us": step_medians(hooked, "step_host_us"),
        "hooked_runs": hooked,
    }
    if device == "cuda":
        out["step_device_us"] = step_medians(hooked, "step_device_us")
    if trace is not None:
        profiled(p.model, p.run, device, trace)
        out["trace"] = trace.name
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--rounds", type=int, default=12, help="Rounds over the cases (one plain, one hooked run each)."
    )
    parser.add_argument("--cases", default="", help="Comma-separated case names (default: all).")
    parser.add_argument("--profile", default="", help="Comma-separated case names to trace (after the rounds).")
    parser.add_argument("--trace-dir", type=Path, default=None, help="Where traces go (default: beside --out).")
    parser.add_argument("--smoke", action="store_true", help="Tiny dimensions on the CPU: tests the script.")
    args = parser.parse_args(argv)
    import torch
    import transformers

    names = [n for n in args.cases.split(",") if n]
    cases = [c for c in CASES if not names or c.name in names]
    if names and len(cases) != len(names):
        parser.error(f"unknown case in --cases: {sorted(set(names) - {c.name for c in CASES})}")
    traced = {n for n in args.profile.split(",") if n}
    trace_dir = args.trace_dir or args.out.parent
    args.out.parent.mkdir(parents=True, exist_ok=True)
    trace_dir.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda"
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else "cpu (smoke run)",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "smoke": args.smoke,
        "rounds": args.rounds,
        "host_probes": [],
        "cases": [],
    }
    prepared: list[Prepared] = []
    for case in cases:
        try:
            prepared.append(prepare(case, device, args.smoke))
        except Exception as exc:  # one failing case must not stop the others
            out["cases"].append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"})
            print(case.name, "error", exc, flush=True)
    for r in range(args.rounds):
        out["host_probes"].append({"round": r, "t_s": time.perf_counter(), **host_probe(device)})
        one_round([prepared[i] for i in round_order(len(prepared), r)], device)
        print(f"round {r}", " ".join(f"{p.case.name}={p.walls[-1] / 1e3:.1f}ms" for p in prepared), flush=True)
    for p in prepared:
        trace = trace_dir / f"{p.case.name}.trace.json.gz" if p.case.name in traced else None
        try:
            out["cases"].append(case_row(p, device, trace, args.smoke))
        except Exception as exc:
            out["cases"].append({"case": p.case.name, "error": f"{type(exc).__name__}: {exc}"})
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
