#!/usr/bin/env bash
# Issue 21 in one call on a machine with 4 GPUs (H100 or H200): collectives measured and fitted,
# tensor-parallel runs measured per rank and compared with `simulate --tp N`.
#
# Run from the repo root, with pydantic/simpy importable (benchmarks/gpu/env.sh installs .whl/ when present):
#   OUT=/path/to/out bash benchmarks/gpu/tp_h100.sh
# Budget: BUDGET_S seconds for everything (default 500); every step runs under `timeout` and is
# skipped when too little budget is left, so a hang costs one step, not the call. Steps:
#   1. collectives: 5 collectives x group sizes 2..N x 15 sizes 4K..1G (NCCL kernel time, median of 10)
#   2. fit: alpha / bus bandwidth per (collective, group size)
#   3. TP runs (random bf16 weights, HF eager + SDPA): Llama-3.1-8B at TP 2 and TP 4, Llama-3.1-70B cut
#      to 2 layers at TP 4; prefill b1 s2048 and decode b8 kv2048; one profiled step per rank
#   4. prediction: capture on meta, shard, simulate (interconnect and measured collective costs), compare
#   5. the sharded graphs' own collectives replayed (validators.collectives --graph)
# Overrides for a CPU smoke run (gloo, a tiny config): NGPU, TP_DEVICE (cpu), TP_DTYPE (fp32), MODEL_8B,
# MODEL_70B, SEQ, KV, SIZES, POINTS, HW.
# Files under $OUT (7): summary.txt, collectives.jsonl, collective_fit.json, tp_summary.json,
# tp_compare.json, collectives_graph.jsonl, tp_traces.tar.gz (per-rank traces, per-run summaries, logs).
set -uo pipefail
. benchmarks/gpu/env.sh
BUDGET_S=${BUDGET_S:-500}
START=$(date +%s)
WORK=${WORK:-/tmp/opgraph-tp}
rm -rf "$WORK"; mkdir -p "$WORK/tp" "$WORK/logs" "$WORK/graphs"
SUMMARY="$OUT/summary.txt"
RUN="$PY -m torch.distributed.run --standalone"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4} TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

left() { echo $(( START + BUDGET_S - $(date +%s) )); }
step() {  # NAME LIMIT_S CMD... : run under timeout, log to $WORK/logs/NAME.log, tail into the summary
  local name=$1 lim=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 30 ]; then echo "== SKIPPED $name (${l}s of budget left)" | tee -a "$SUMMARY"; return 99; fi
  [ "$lim" -gt "$l" ] && lim=$l
  local t0; t0=$(date +%s)
  echo "== $name (limit ${lim}s, $(( t0 - START ))s in)" | tee -a "$SUMMARY"
  timeout -k 10 "$lim" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  grep -v -E '^(W[0-9]{4}|USDT|\s*warnings\.warn|\s*return func|.*FutureWarning)' "$WORK/logs/$name.log" | tail -n "${TAIL:-40}" >>"$SUMMARY"
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 ))s" | tee -a "$SUMMARY"
  return $rc
}

NGPU=${NGPU:-$(nvidia-smi -L 2>/dev/null | wc -l)}
TP_DEVICE=${TP_DEVICE:-auto}; TP_DTYPE=${TP_DTYPE:-bf16}
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case "$GPU_NAME" in *H200*) HW=${HW:-h200} ;; *) HW=${HW:-h100} ;; esac
MODEL_8B=${MODEL_8B:-llama-3.1-8b}; MODEL_70B=${MODEL_70B:-llama-3.1-70b}
SEQ=${SEQ:-2048}; KV=${KV:-2048}; SIZES=${SIZES:-4K..1G}; POINTS=${POINTS:-15}
{
  echo "# issue 21 TP run on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1) x $NGPU (hardware spec $HW)"
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  nvidia-smi topo -m 2>/dev/null | head -n $(( NGPU + 2 ))
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  date -u
} 2>&1 | tee "$SUMMARY"
if [ "$NGPU" -lt 2 ]; then echo "needs 2 or more GPUs, found $NGPU" | tee -a "$SUMMARY"; exit 2; fi
TP_MAX=$(( NGPU >= 4 ? 4 : 2 ))

# 1-2. Collectives over every power-of-two group up to TP_MAX, then the fit.
DTYPE_ARG=(); [ "$TP_DEVICE" = cpu ] && DTYPE_ARG=(--dtype fp32)
step collectives 150 $RUN --nproc-per-node "$TP_MAX" -m validators.collectives --device "$TP_DEVICE" \
  ${DTYPE_ARG[@]+"${DTYPE_ARG[@]}"} \
  --sizes "$SIZES" --points "$POINTS" --warmup 3 --repeats 10 --out "$OUT/collectives.jsonl" -q
step fit 40 $PY -m hardware.collective_fit "$OUT/collectives.jsonl" --hardware "$HW" --out "$OUT/collective_fit.json"

# 3. TP runs, one torchrun job per (model, TP degree), both phases in each.
tp_run() {  # NAME NPROC LIMIT ARGS...
  local name=$1 n=$2 lim=$3; shift 3
  local gpus; gpus=$(seq -s, 0 $(( n - 1 )))
  CUDA_VISIBLE_DEVICES=$gpus step "$name" "$lim" $RUN --nproc-per-node "$n" benchmarks/gpu/tp_run.py \
    --phases prefill,decode --batch 1 --seq-len "$SEQ" --decode-batch 8 --kv-len "$KV" --device "$TP_DEVICE" \
    --dtype "$TP_DTYPE" --warmup 2 --wall-repeats 7 --profile-steps 1 --out "$WORK/tp/$name" "$@"
}
tp_run llama8b_tp2 2 120 --model "$MODEL_8B"
if [ "$TP_MAX" -ge 4 ]; then
  tp_run llama8b_tp4 4 120 --model "$MODEL_8B"
  tp_run llama70b_l2_tp4 4 110 --model "$MODEL_70B" --layers 2
else
  tp_run llama70b_l2_tp2 2 110 --model "$MODEL_70B" --layers 2
fi

# Every run's summary in one file (a JSON array of TpRunSummary).
$PY - "$WORK/tp" "$OUT/tp_summary.json" <<'PYEOF'
import json, sys
from pathlib import Path
runs = [json.loads(p.read_text()) for p in sorted(Path(sys.argv[1]).glob("*/summary.json"))]
Path(sys.argv[2]).write_text(json.dumps(runs, indent=1) + "\n")
print(f"tp_summary.json: {len(runs)} job(s)")
PYEOF

# 4. Prediction and comparison (CPU), keeping the sharded graphs for step 5.
FIT_ARG=()
[ -s "$OUT/collective_fit.json" ] && FIT_ARG=(--collective-fit "$OUT/collective_fit.json")
# Cost models: the roofline, and on H100 the tables calibrated from single-GPU replay (benchmarks/results/gpu/h100;
# fitted on TP=1 configs, so the sharded shapes are out of their sample).
COST=(--cost-model roofline)
if [ "$HW" = h100 ]; then
  for t in benchmarks/results/gpu/h100/llama8b_prefill2048.calibrated.json benchmarks/results/gpu/h100/llama8b_decode_b8_kv2048.calibrated.json; do
    [ -f "$t" ] && COST+=(--cost-model "$t")
  done
fi
TAIL=80 step predict 150 $PY benchmarks/gpu/tp_predict.py --measured "$OUT/tp_summary.json" --hardware "$HW" \
  "${COST[@]}" ${FIT_ARG[@]+"${FIT_ARG[@]}"} --graphs-dir "$WORK/graphs" --out "$OUT/tp_compare.json"

# 5. The sharded graphs' own collectives (exact sizes the TP runs use).
GRAPHS=()
for g in "$WORK"/graphs/*_tp*.json.gz; do [ -f "$g" ] && GRAPHS+=(--graph "$g"); done
if [ "${#GRAPHS[@]}" -gt 0 ]; then
  step graph_collectives 90 $RUN --nproc-per-node "$TP_MAX" -m validators.collectives --device "$TP_DEVICE" \
    ${DTYPE_ARG[@]+"${DTYPE_ARG[@]}"} "${GRAPHS[@]}" \
    --warmup 3 --repeats 20 --out "$OUT/collectives_graph.jsonl" -q
fi

# Pack traces, per-run summaries and logs (kept under 16 MiB: one profiled step per rank).
tar -czf "$OUT/tp_traces.tar.gz" -C "$WORK" tp logs
if [ "$(stat -c %s "$OUT/tp_traces.tar.gz")" -gt $(( 15 * 1024 * 1024 )) ]; then
  echo "traces over 15 MiB: keeping rank 0's only" | tee -a "$SUMMARY"
  (cd "$WORK" && tar -czf "$OUT/tp_traces.tar.gz" logs tp/*/summary.json tp/*/*.rank0.json.gz)
fi
echo "total: $(( $(date +%s) - START ))s" | tee -a "$SUMMARY"
ls -la "$OUT" | tee -a "$SUMMARY"
