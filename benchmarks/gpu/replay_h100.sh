#!/usr/bin/env bash
# Replay Llama-3.1-8B (prefill 2048, decode batch 8 kv 2048) and Qwen3-30B-A3B (prefill 1024) on one GPU.
#
# Run from the repo root on the GPU machine:  OUT=/path/to/out bash benchmarks/gpu/replay_h100.sh
# Graphs are captured on meta (no weights), then each is replayed twice: run 1 checks every config
# against float64 (CPU) and measures NVML energy; run 2 only times, and its medians are compared with
# run 1's (the run-to-run spread, ops over 20 us). Writes 6 JSONL files and summary.txt under $OUT
# and prints the coverage lines. Targets: 100% of configs replayed or given a reason, >99% of the
# estimated op time replayed, run-to-run spread of medians < 2% for ops over 20 us. ~4-6 min on an H100.
set -uo pipefail
. benchmarks/gpu/env.sh
GRAPHS=${GRAPHS:-/tmp/opgraph-graphs}
mkdir -p "$GRAPHS"
SUMMARY="$OUT/summary.txt"
{
  echo "# opgraph replay on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  $PY -c 'import pynvml' 2>/dev/null && echo "nvml: yes" || echo "nvml: no (energy not measured)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
} | tee "$SUMMARY"

start=$(date +%s)
capture() {  # name, then capture arguments
  local name=$1; shift
  local t0=$(date +%s)
  $PY -m opgraph capture "$@" -o "$GRAPHS/$name.json.gz" >/dev/null || { echo "capture $name failed" | tee -a "$SUMMARY"; return 1; }
  echo "captured $name in $(( $(date +%s) - t0 )) s" | tee -a "$SUMMARY"
}
capture llama8b_prefill2048 llama-3.1-8b --phase prefill --seq-len 2048
capture llama8b_decode_b8_kv2048 llama-3.1-8b --phase decode --batch 8 --kv-len 2048
capture qwen3_30b_a3b_prefill1024 qwen3-30b-a3b --phase prefill --seq-len 1024

for name in llama8b_prefill2048 llama8b_decode_b8_kv2048 qwen3_30b_a3b_prefill1024; do
  g="$GRAPHS/$name.json.gz"
  [ -f "$g" ] || continue
  t0=$(date +%s)
  echo "== $name: run 1 (check + energy + timing)" | tee -a "$SUMMARY"
  $PY -m opgraph replay "$g" --device cuda --hardware h100 -o "$OUT/$name.jsonl" \
    | tee "$GRAPHS/$name.run1.log" | grep -E "^(device|coverage|results|error|warning)" | tee -a "$SUMMARY"
  echo "== $name: run 2 (timing only, against run 1)" | tee -a "$SUMMARY"
  $PY -m opgraph replay "$g" --device cuda --hardware h100 -o "$OUT/$name.run2.jsonl" --no-check --no-energy \
    --baseline "$OUT/$name.jsonl" -q | grep -E "^(device|coverage|run-to-run|error|warning)" | tee -a "$SUMMARY"
  echo "$name: $(( $(date +%s) - t0 )) s" | tee -a "$SUMMARY"
done
# Per-config detail of run 1 (status, share, median, spread, energy), for the README.
$PY - "$OUT" <<'PYEOF' | tee -a "$SUMMARY"
import sys
from pathlib import Path
from validators import load_results, run_to_run
out = Path(sys.argv[1])
for p in sorted(out.glob("*.jsonl")):
    if p.name.endswith(".run2.jsonl"):
        continue
    rs = load_results(p)
    print(f"\n## {p.stem}  ({rs[0].device_name if rs else '?'})")
    print(f"{'status':<10} {'share':>6} {'count':>5} {'median_us':>10} {'spread':>7} {'mJ/call':>8}  definition")
    for r in rs:
        med = f"{r.median_us:.2f}" if r.median_us is not None else "-"
        spr = f"{100 * r.timing.spread:.1f}%" if r.timing else "-"
        mj = f"{r.energy.joules_per_call * 1e3:.3f}" if r.energy else "-"
        sh = f"{100 * r.share:.1f}%" if r.share is not None else "-"
        print(f"{r.status.value:<10} {sh:>6} {r.count:>5} {med:>10} {spr:>7} {mj:>8}  {r.definition} {r.reason[:80]}")
    run2 = p.with_name(p.stem + ".run2.jsonl")
    if run2.exists():
        print(run_to_run(rs, load_results(run2)).line())
PYEOF
echo "total: $(( $(date +%s) - start )) s" | tee -a "$SUMMARY"
