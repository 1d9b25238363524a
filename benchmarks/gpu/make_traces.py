"""Record a held-out set of small torch-profiler traces on a GPU, each with its ground truth.

Issue 19's test set: traces of different model families and ways of running them (HF eager with
SDPA or eager attention, multi-step ``generate``, ``torch.compile``, a static cache), small enough to
commit (two to four layers, short sequences, few steps), none of which the kernel rules were written
against. Each trace's ground truth is what the script ran: the number of transformer layers, the
forward passes and the stage of each (prefill or decode), and the way it was run. The manifest
(``manifest.json``) records it beside the GPU, torch and transformers versions.

Run on a GPU machine from the repo root (weights are random, built from the shipped preset configs;
nothing is downloaded)::

    python3 benchmarks/gpu/make_traces.py --out "$OUT/traces"

A case that fails (an architecture the installed transformers cannot build, a compile error) is
recorded in the manifest with its error and skipped; the others still run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRESETS = REPO / "opgraph" / "capture" / "presets"


@dataclass
class Case:
    """One trace to record."""

    name: str
    model: str
    """A preset name (``opgraph/capture/presets``) or ``hf:<model_type>`` for a transformers default config."""
    layers: int
    mode: str
    """``forward`` (one prefill), ``generate`` (prefill + decode steps), ``compile`` (torch.compile'd forward),
    ``static`` (generate with a static cache)."""
    batch: int = 1
    seq_len: int = 128
    new_tokens: int = 0
    attn: str = "sdpa"
    overrides: dict[str, Any] = field(default_factory=dict)


CASES = [
    Case("llama1b_sdpa_prefill512", "llama-3.2-1b", 2, "forward", seq_len=512),
    Case("llama1b_generate_p64_d5", "llama-3.2-1b", 2, "generate", batch=2, seq_len=64, new_tokens=6),
    Case("qwen25_7b_eager_attn_prefill256", "qwen2.5-7b", 2, "forward", seq_len=256, attn="eager"),
    Case("qwen3moe_generate_p128_d3", "qwen3-30b-a3b", 2, "generate", seq_len=128, new_tokens=4),
    Case("mixtral_prefill256", "mixtral-8x7b", 2, "forward", seq_len=256),
    Case("llama8b_compile_prefill256", "llama-3.1-8b", 2, "compile", seq_len=256),
    Case("llama8b_static_cache_generate", "llama-3.1-8b", 2, "static", batch=4, seq_len=64, new_tokens=5),
    Case("bloom560m_prefill256", "bloom-560m", 4, "forward", seq_len=256, attn="eager"),
    Case("gpt2_prefill256", "hf:gpt2", 3, "forward", seq_len=256),
    Case("gemma3_prefill128", "gemma-3-27b", 2, "forward", seq_len=128),
    Case("gptoss20b_prefill128", "gpt-oss-20b", 2, "forward", seq_len=128, attn="eager"),
    Case("qwen25_7b_generate_eager_attn", "qwen2.5-7b", 2, "generate", batch=2, seq_len=32, new_tokens=4, attn="eager"),
]

SECOND_SET = [
    # Recorded after the analyzer's fixes for the first set: other families and ways of running.
    Case("phi3_prefill256", "hf:phi3", 2, "forward", seq_len=256),
    Case("mistral_generate_p64_n5", "hf:mistral", 2, "generate", batch=2, seq_len=64, new_tokens=5),
    Case("opt_prefill256_eager", "hf:opt", 3, "forward", seq_len=256, attn="eager"),
    Case("gptneox_prefill256", "hf:gpt_neox", 2, "forward", seq_len=256),
    Case("olmo_prefill256", "hf:olmo", 2, "forward", seq_len=256),
    Case("deepseekv3_mla_prefill128", "deepseek-v3", 2, "forward", seq_len=128),
    Case("qwen25coder32b_generate_p32_n4", "qwen2.5-coder-32b", 2, "generate", seq_len=32, new_tokens=4),
    Case("vicuna7b_compile_prefill256", "vicuna-7b", 2, "compile", seq_len=256),
    Case("mixtral_generate_p32_n4", "mixtral-8x7b", 2, "generate", seq_len=32, new_tokens=4),
    Case("gemma3_generate_p32_n4", "gemma-3-27b", 2, "generate", seq_len=32, new_tokens=4),
    Case("llama1b_static_cache_b1", "llama-3.2-1b", 2, "static", seq_len=32, new_tokens=5),
    Case("stablelm_prefill256_eager", "hf:stablelm", 2, "forward", seq_len=256, attn="eager"),
]
"""A second held-out set (issue 19): ``--set 2``."""


def build_config(case: Case) -> Any:
    from transformers import AutoConfig

    if case.model.startswith("hf:"):
        config = AutoConfig.for_model(case.model[3:])
    else:
        raw = json.loads((PRESETS / f"{case.model}.json").read_text())
        raw = raw.get("config", raw)
        raw = {k: v for k, v in raw.items() if not k.startswith("_")}
        config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    text = getattr(config, "text_config", None) or config
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if hasattr(text, key):
            setattr(text, key, case.layers)
    if hasattr(text, "layer_types") and isinstance(text.layer_types, list):
        text.layer_types = text.layer_types[: case.layers]
    for key, value in case.overrides.items():
        setattr(text, key, value)
    return config


def run_case(case: Case, out: Path, device: str = "cuda") -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = build_config(case)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation=case.attn)
    model.eval()
    vocab = int(getattr(getattr(config, "text_config", None) or config, "vocab_size", 32000))
    ids = torch.randint(0, vocab, (case.batch, case.seq_len), device=device)
    passes: list[str] = []

    if case.mode in ("forward", "compile"):
        fn = torch.compile(model) if case.mode == "compile" else model

        def work() -> None:
            with torch.no_grad():
                fn(input_ids=ids)

        passes = ["prefill"]
    else:
        kwargs: dict[str, Any] = {
            "max_new_tokens": case.new_tokens,
            "min_new_tokens": case.new_tokens,
            "do_sample": False,
        }
        if case.mode == "static":
            kwargs["cache_implementation"] = "static"

        def work() -> None:
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)

        # generate runs one prefill forward, then one decode forward per new token after the first.
        passes = ["prefill"] + ["decode"] * (case.new_tokens - 1)

    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    for _ in range(2):  # warm-up (and compile)
        work()
    sync()
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    calls: list[int] = []  # the forward passes actually run inside the profiled window
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    with profile(activities=activities, record_shapes=True) as prof:
        work()
        sync()
    hook.remove()
    if len(calls) != len(passes) and case.mode != "compile":  # dynamo may fold the hook into its graph
        raise RuntimeError(f"ran {len(calls)} forward passes, expected {len(passes)}: the ground truth would be wrong")
    raw = out / f"{case.name}.json"
    prof.export_chrome_trace(str(raw))
    with raw.open("rb") as src, gzip.open(out / f"{case.name}.json.gz", "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    events = prof.events()
    graph_launches = sum(1 for e in events if e.name == "cudaGraphLaunch")
    return {
        "file": f"{case.name}.json.gz",
        "bytes": (out / f"{case.name}.json.gz").stat().st_size,
        "layers": case.layers,
        "passes": len(passes),
        "forward_calls_seen": len(calls),
        "stages": passes,
        "cuda_graph_launches": graph_launches,
        "architecture": type(model).__name__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument("--set", type=int, default=1, choices=(1, 2), help="which held-out set to record")
    parser.add_argument("--device", default="cuda", help="cuda (the real run) or cpu (a smoke test of the script)")
    args = parser.parse_args(argv)
    import torch
    import transformers

    args.out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "made_by": "benchmarks/gpu/make_traces.py",
        "cases": [],
    }
    for case in CASES if args.set == 1 else SECOND_SET:
        if args.only and case.name not in args.only:
            continue
        t0 = time.perf_counter()
        entry: dict[str, Any] = {"case": asdict(case)}
        try:
            entry["truth"] = run_case(case, args.out, args.device)
            entry["status"] = "ok"
        except Exception as exc:  # one failing case must not stop the others
            entry["status"] = "error"
            entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            entry["traceback"] = traceback.format_exc()[-4000:]
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        manifest["cases"].append(entry)
        print(f"{case.name}: {entry['status']} in {entry['seconds']} s", flush=True)
        import gc

        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
