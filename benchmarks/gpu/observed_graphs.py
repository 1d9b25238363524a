"""Graphs of training walls captured on the GPU with the model's own routing (issue 18, host profile).

A training wall of an MoE model times the unmodified model (``heldout.build_model``: seeded random weights)
with its own router. A meta capture of the same shape spreads the tokens evenly over the experts, while a
random model's router concentrates them after the first layer (the 3-layer fp16 Qwen3-MoE wall loaded
252, 142 and 80 expert products in its three layers, the meta graph 254 in each). This captures each
named case with ``opgraph.capture.capture`` on the GPU from the same model and the same seeded token ids
(``heldout.token_ids`` follows the capture's seeds), so the graph holds the run's own expert loads.
``benchmarks/gpu/host_profile.sh`` (``REFIT=1 OBSERVED=graphs.tar.gz``) fits on them.

    python3 benchmarks/gpu/observed_graphs.py --out $OUT/observed --cases A,B
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import heldout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for CASE.json.gz and log.json")
    ap.add_argument("--cases", required=True, help="comma-separated heldout.TRAIN_WALL_CASES names")
    args = ap.parse_args()
    import torch

    from opgraph.capture import capture
    from opgraph.ir import save_graph

    known = {c["case"]: c for c in heldout.TRAIN_WALL_CASES}
    wanted = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in known]
    if unknown:
        ap.error(f"unknown case(s) {', '.join(unknown)} (--cases)")
    if not torch.cuda.is_available():
        print("error: needs a CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    log = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cases": {}}  # fmt: skip
    for name in wanted:
        case = known[name]
        model, _ = heldout.build_model(heldout.case_config(case, False), case["dtype"], "cuda")
        kw = {"kv_len": case["kv_len"]} if case["phase"] == "decode" else {"seq_len": case["seq_len"]}
        t0 = time.perf_counter()
        g = capture(model, phase=case["phase"], batch=case["batch"], dtype=case["dtype"], device="cuda", **kw)
        g = g.model_copy(update={"metadata": g.metadata.model_copy(update={"model": case["preset"]})})
        save_graph(g, args.out / f"{name}.json.gz")
        experts = [op for op in g.ops if op.target == "moe_experts_gate_up"]
        by_layer: dict[str, int] = {}
        for op in experts:
            by_layer[str(op.layer)] = by_layer.get(str(op.layer), 0) + 1
        log["cases"][name] = {"ops": len(g.ops), "gate_up_products_by_layer": by_layer,
                              "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
        print(name, log["cases"][name], flush=True)
        del model, g
        gc.collect()
        torch.cuda.empty_cache()
    (args.out / "log.json").write_text(json.dumps(log, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
