#!/usr/bin/env bash
# Sharded replay over 2 GPUs of one host with torchrun (rank 0 gathers the results into one JSONL).
# Run from the repo root on a 2-GPU machine, after replay_h100.sh's captures (or any graph):
#   OUT=/path/to/out bash benchmarks/gpu/replay_2gpu.sh [GRAPH]
set -euo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
G=${1:-/tmp/opgraph-graphs/llama8b_decode_b8_kv2048.json.gz}
[ -f "$G" ] || $PY -m opgraph capture llama-3.1-8b --phase decode --batch 8 --kv-len 2048 -o "$G"
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m opgraph replay "$G" --device cuda \
  --hardware h100 -o "$OUT/replay_2gpu.jsonl" -q | tee "$OUT/replay_2gpu.txt"
