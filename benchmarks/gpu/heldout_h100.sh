#!/usr/bin/env bash
# Held-out accuracy cases (issue 18, "Prove it") on one GPU: unmodified HF models (random weights,
# SDPA, their own MoE routing) from opgraph's preset configs cut to 2-4 layers; per case 9 timed runs
# (wall) and 9 profiled runs (GPU time = sum of kernel/memcpy/memset durations), one run's trace kept,
# PyTorch's RuntimeEstimator alongside. See benchmarks/gpu/heldout.py.
#
# Run from the repo root on the GPU machine:  OUT=/path/to/out bash benchmarks/gpu/heldout_h100.sh
# About 6-7 minutes on an H100 (cases over the budget are skipped with a note; the whole command
# stays under 8 minutes). Writes $OUT/heldout.tar.gz (heldout/: summary.json, log.txt and per case
# CASE.json, CASE.config.json, CASE.trace.json.gz), $OUT/heldout_summary.json and $OUT/heldout_log.txt.
# Then, on any machine: python benchmarks/heldout_report.py heldout.tar.gz (the CPU-side report).
# Walls round robin (a host probe per round, the training walls of the host profile after the held-out
# cases; about 7.5 minutes): BUDGET=450 LIMIT=520 bash benchmarks/gpu/heldout_h100.sh --round-robin 40
# --train-walls --no-estimator, then benchmarks/heldout_pool.py ... --walls heldout.tar.gz.
set -uo pipefail
. benchmarks/gpu/env.sh
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-380}   # seconds of cases, from the script's start
LIMIT=${LIMIT:-440}     # hard stop of the Python process
DIR="$OUT/heldout"
mkdir -p "$DIR"
{
  echo "# heldout on $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1)"
  echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
} | tee "$DIR/log.txt"
timeout -k 10 "$LIMIT" $PY benchmarks/gpu/heldout.py --out "$DIR" --budget-s "$BUDGET" "$@" 2>&1 \
  | grep --line-buffered -v '^USDT:' | tee -a "$DIR/log.txt"
rc=${PIPESTATUS[0]}
echo "heldout.py exit status $rc" | tee -a "$DIR/log.txt"
[ -f "$DIR/summary.json" ] && cp "$DIR/summary.json" "$OUT/heldout_summary.json"
cp "$DIR/log.txt" "$OUT/heldout_log.txt"
tar -czf "$OUT/heldout.tar.gz" -C "$OUT" heldout && rm -rf "$DIR"
ls -la "$OUT"
exit "$rc"
