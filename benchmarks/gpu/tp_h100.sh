#!/usr/bin/env bash
# Issue 21 in one call of at most 5 minutes on a machine with 4 GPUs (H100 or H200): collectives
# measured (transfer and wait apart) and fitted by regime, tensor-parallel runs measured per rank and
# compared with `simulate --tp N` part by part (compute, collective transfer, GPU time without the
# wait for peers, wall time).
#
# Run from the repo root, with pydantic/simpy importable (benchmarks/gpu/env.sh installs .whl/ when present):
#   OUT=/path/to/out bash benchmarks/gpu/tp_h100.sh
# Budget: BUDGET_S seconds for everything (default 270); every step runs under `timeout` and is
# skipped when too little budget is left, so a hang costs one step, not the call. Steps:
#   1. collectives: 5 collectives x group sizes 2..N x 15 sizes 4K..1G. Every rank queues a GPU sleep
#      (--lead-us) before its timed calls so they run back to back, paced by the GPUs; every rank's
#      kernels are gathered; transfer = the shortest rank's kernel per call, wait = the rest.
#      (The first run timed rank 0 alone with host-paced calls: ~100 us of wait at every size below
#      ~30 MiB whenever rank 0 was not the last to launch.)
#   2. TP runs (random bf16 weights, HF eager + SDPA): Llama-3.1-8B at TP 2 and TP 4, Llama-3.1-70B cut
#      to 2 layers at TP 4 (and both at TP 8 on a machine with 8 GPUs); prefill b1 s2048 and decode b8
#      kv2048; 7 timed steps, 2 profiled steps,
#      the ranks lined up (CUDA sync + barrier) before every step
#   3. the runs' sharded graphs (capture on meta), and their own collectives replayed like step 1
#   4. fit: regimes per (collective, group size) from steps 1 and 3, with its held-out error
#   5. prediction and comparison per rank (tp_compare.json, tp_compare.md)
# Overrides for a CPU smoke run (gloo, a tiny config): NGPU, TP_DEVICE (cpu), TP_DTYPE (fp32), MODEL_8B,
# MODEL_70B, SEQ, KV, SIZES, POINTS, HW, REPEATS, WALL_REPEATS, PROFILE_STEPS.
# Files under $OUT (8): summary.txt, collectives.jsonl, collectives_graph.jsonl, collective_fit.json,
# tp_summary.json, tp_compare.json, tp_compare.md, tp_traces.tar.gz (per-rank traces, per-run summaries, logs).
set -uo pipefail
. benchmarks/gpu/env.sh
BUDGET_S=${BUDGET_S:-270}
START=$(date +%s)
WORK=${WORK:-/tmp/opgraph-tp}
rm -rf "$WORK"; mkdir -p "$WORK/tp" "$WORK/logs" "$WORK/graphs"
SUMMARY="$OUT/summary.txt"
RUN="$PY -m torch.distributed.run --standalone"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PYTHONWARNINGS=${PYTHONWARNINGS:-ignore::UserWarning:torch.profiler.profiler}

left() { echo $(( START + BUDGET_S - $(date +%s) )); }
step() {  # NAME LIMIT_S CMD... : run under timeout, log to $WORK/logs/NAME.log, tail into the summary
  local name=$1 lim=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then echo "== SKIPPED $name (${l}s of budget left)" | tee -a "$SUMMARY"; return 99; fi
  [ "$lim" -gt "$l" ] && lim=$l
  local t0; t0=$(date +%s)
  echo "== $name (limit ${lim}s, $(( t0 - START ))s in)" | tee -a "$SUMMARY"
  timeout -k 10 "$lim" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  grep -v -E '^(W[0-9]{4}|USDT|\s*warnings\.warn|\s*_warn_once|\s*return func|.*(Future|User)Warning)' \
    "$WORK/logs/$name.log" | tail -n "${TAIL:-40}" >>"$SUMMARY"
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$SUMMARY"
  return $rc
}

NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
TP_DEVICE=${TP_DEVICE:-auto}; TP_DTYPE=${TP_DTYPE:-bf16}
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU_NAME" in *H200*) HW=${HW:-h200} ;; *) HW=${HW:-h100} ;; esac
MODEL_8B=${MODEL_8B:-llama-3.1-8b}; MODEL_70B=${MODEL_70B:-llama-3.1-70b}
SEQ=${SEQ:-2048}; KV=${KV:-2048}; SIZES=${SIZES:-4K..1G}; POINTS=${POINTS:-15}
REPEATS=${REPEATS:-10}; WALL_REPEATS=${WALL_REPEATS:-7}; PROFILE_STEPS=${PROFILE_STEPS:-2}
{
  echo "# issue 21 TP run on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) x $NGPU (hardware spec $HW)"
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  nvidia-smi topo -m 2>/dev/null | head -n $(( NGPU + 2 ))
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  date -u
} 2>&1 | tee "$SUMMARY"
if [ "$NGPU" -lt 2 ]; then echo "needs 2 or more GPUs, found $NGPU" | tee -a "$SUMMARY"; exit 2; fi
TP_MAX=$(( NGPU >= 8 ? 8 : NGPU >= 4 ? 4 : 2 ))  # TP 8 on an 8-GPU machine (set BUDGET_S ~400 there)
DTYPE_ARG=(); [ "$TP_DEVICE" = cpu ] && DTYPE_ARG=(--dtype fp32)
COLL=(-m validators.collectives --device "$TP_DEVICE" ${DTYPE_ARG[@]+"${DTYPE_ARG[@]}"} --warmup 3 --lead-us 3000 -q)

# 1. Collectives over every power-of-two group up to TP_MAX.
step collectives 70 $RUN --nproc-per-node "$TP_MAX" "${COLL[@]}" --sizes "$SIZES" --points "$POINTS" \
  --repeats "$REPEATS" --out "$OUT/collectives.jsonl"

# 2. TP runs, one torchrun job per (model, TP degree), both phases in each.
tp_run() {  # NAME NPROC LIMIT ARGS...
  local name=$1 n=$2 lim=$3; shift 3
  local gpus; gpus=$(seq -s, 0 $(( n - 1 )))
  CUDA_VISIBLE_DEVICES=$gpus step "$name" "$lim" $RUN --nproc-per-node "$n" benchmarks/gpu/tp_run.py \
    --phases prefill,decode --batch 1 --seq-len "$SEQ" --decode-batch 8 --kv-len "$KV" --device "$TP_DEVICE" \
    --dtype "$TP_DTYPE" --warmup 2 --wall-repeats "$WALL_REPEATS" --profile-steps "$PROFILE_STEPS" \
    --out "$WORK/tp/$name" "$@"
}
tp_run llama8b_tp2 2 50 --model "$MODEL_8B"
if [ "$TP_MAX" -ge 4 ]; then
  tp_run llama8b_tp4 4 50 --model "$MODEL_8B"
  tp_run llama70b_l2_tp4 4 45 --model "$MODEL_70B" --layers 2
  if [ "$TP_MAX" -ge 8 ]; then
    tp_run llama8b_tp8 8 60 --model "$MODEL_8B"
    tp_run llama70b_l2_tp8 8 55 --model "$MODEL_70B" --layers 2
  fi
else
  tp_run llama70b_l2_tp2 2 45 --model "$MODEL_70B" --layers 2
fi

# Every run's summary in one file (a JSON array of TpRunSummary).
$PY - "$WORK/tp" "$OUT/tp_summary.json" <<'PYEOF'
import json, sys
from pathlib import Path
runs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*/summary.json"))]
Path(sys.argv[2]).write_text(json.dumps(runs, indent=1) + "\n")
print(f"tp_summary.json: {len(runs)} job(s)")
PYEOF

# 3. The runs' sharded graphs, and their own collectives (the exact sizes the TP runs use).
step graphs 40 $PY benchmarks/gpu/tp_predict.py --measured "$OUT/tp_summary.json" --hardware "$HW" \
  --graphs-dir "$WORK/graphs" --graphs-only
GRAPHS=()
for g in "$WORK"/graphs/*_tp*.json.gz; do [ -f "$g" ] && GRAPHS+=(--graph "$g"); done
if [ "${#GRAPHS[@]}" -gt 0 ]; then
  step graph_collectives 30 $RUN --nproc-per-node "$TP_MAX" "${COLL[@]}" "${GRAPHS[@]}" --repeats 20 \
    --out "$OUT/collectives_graph.jsonl"
fi

# 4. The fit: regimes per (collective, group size), leave-one-out and held-out errors.
MEAS=("$OUT/collectives.jsonl"); [ -s "$OUT/collectives_graph.jsonl" ] && MEAS+=("$OUT/collectives_graph.jsonl")
step fit 20 $PY -m hardware.collective_fit "${MEAS[@]}" --hardware "$HW" --heldout --out "$OUT/collective_fit.json"

# 5. Prediction and comparison (CPU). Cost models: the device's shipped profile (the CLI's default, when
# the catalog has one), the roofline, and on H100 the tables calibrated from single-GPU replay
# (benchmarks/results/gpu/h100; fitted on TP=1 configs, so TP shapes are out of their sample).
FIT_ARG=()
[ -s "$OUT/collective_fit.json" ] && FIT_ARG=(--collective-fit "$OUT/collective_fit.json")
COST=(--cost-model roofline)
$PY -c 'import sys; from hardware import load_hardware, hardware_profile; sys.exit(hardware_profile(load_hardware(sys.argv[1])) is None)' "$HW" \
  && COST=(--cost-model profile "${COST[@]}")
if [ "$HW" = h100 ]; then
  for t in benchmarks/results/gpu/h100/llama8b_prefill2048.calibrated.json benchmarks/results/gpu/h100/llama8b_decode_b8_kv2048.calibrated.json; do
    [ -f "$t" ] && COST+=(--cost-model "$t")
  done
fi
TAIL=40 step predict 60 $PY benchmarks/gpu/tp_predict.py --measured "$OUT/tp_summary.json" --hardware "$HW" \
  "${COST[@]}" ${FIT_ARG[@]+"${FIT_ARG[@]}"} --out "$OUT/tp_compare.json" --table "$OUT/tp_compare.md"
[ -s "$OUT/tp_compare.md" ] && cat "$OUT/tp_compare.md" >>"$SUMMARY"

# Pack traces, per-run summaries and logs (under 15 MiB; else rank 0's traces only).
tar -czf "$OUT/tp_traces.tar.gz" -C "$WORK" tp logs
if [ "$(stat -c %s "$OUT/tp_traces.tar.gz")" -gt $(( 15 * 1024 * 1024 )) ]; then
  echo "traces over 15 MiB: keeping rank 0's only" | tee -a "$SUMMARY"
  (cd "$WORK" && tar -czf "$OUT/tp_traces.tar.gz" logs tp/*/summary.json tp/*/*.rank0.json.gz)
fi
echo "total: $(( $(date +%s) - START ))s" | tee -a "$SUMMARY"
ls -la "$OUT" | tee -a "$SUMMARY"
