#!/usr/bin/env bash
# Sharded replay over 2 GPUs of one host with torchrun (rank 0 gathers the results into one JSONL).
# Run from the repo root on a 2-GPU machine, after replay_h100.sh's captures (or any graph):
#   OUT=/path/to/out bash benchmarks/gpu/replay_2gpu.sh [GRAPH]
set -euo pipefail
. benchmarks/gpu/env.sh
G=${1:-/tmp/opgraph-graphs/llama8b_decode_b8_kv2048.json.gz}
[ -f "$G" ] || $PY -m opgraph capture llama-3.1-8b --phase decode --batch 8 --kv-len 2048 -o "$G"
$PY -m torch.distributed.run --standalone --nproc-per-node 2 -m opgraph replay "$G" --device cuda \
  --hardware h100 -o "$OUT/replay_2gpu.jsonl" -q | tee "$OUT/replay_2gpu.txt"
