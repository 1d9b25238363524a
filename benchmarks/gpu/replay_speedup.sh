#!/usr/bin/env bash
# Issue 21: replay of one graph's configs sharded over 2 GPUs against the same replay on one GPU.
# Run from the repo root on a machine with 2 GPUs:  OUT=/path/to/out bash benchmarks/gpu/replay_speedup.sh
# The graph: Llama-3.1-8B, a planned generation of 24 tokens after a 512-token prompt, captured on
# meta (113 unique op configs: every decode step's attention has its own KV length). Each replay is
# timed end to end (process start to exit) and its fixed part (imports, CUDA and process-group init,
# graph load: the same command with --limit 0) apart, so the report gives both the end-to-end and
# the replay-only speedup. LIMIT (default 24) replays only the most expensive configs: with the
# default timing (cold L2, issue times in sequence, 9-25 profiler sessions) a config takes ~7 s on one
# H100, so all 113 take ~14 minutes (the first attempt, cut at 560 s, is in
# benchmarks/results/gpu/h100x2/replay_speedup/). Writes $OUT/replay_1gpu.jsonl, $OUT/replay_2gpu.jsonl,
# $OUT/replay_speedup.json and $OUT/replay_speedup.log. About 5 minutes on 2 x H100.
set -uo pipefail
. benchmarks/gpu/env.sh
LOG="$OUT/replay_speedup.log"
G=/tmp/opgraph-speedup.json.gz
LIMIT=${LIMIT:-24}
{
  echo "# replay speedup on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x $(nvidia-smi -L | wc -l)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
  $PY -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} 2>&1 | tee "$LOG"
$PY -m opgraph capture llama-3.1-8b --phase generate --seq-len 512 --new-tokens 24 -o "$G" 2>&1 | tail -2 | tee -a "$LOG"
RUN2="$PY -m torch.distributed.run --standalone --nproc-per-node 2"
timed() {  # NAME CMD...: wall seconds of CMD into $OUT/NAME.s
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  timeout -k 10 400 "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "$(( ($(date +%s%N) - t0) / 1000000 ))e-3" > "$OUT/$name.s"
  echo "$name: rc=$rc, $(cat "$OUT/$name.s") s" | tee -a "$LOG"
}
timed fixed_1gpu $PY -m opgraph replay "$G" --device cuda --limit 0 -o /tmp/fixed1.jsonl -q
timed full_1gpu $PY -m opgraph replay "$G" --device cuda --limit "$LIMIT" -o "$OUT/replay_1gpu.jsonl" -q
timed fixed_2gpu $RUN2 -m opgraph replay "$G" --device cuda --limit 0 -o /tmp/fixed2.jsonl -q
timed full_2gpu $RUN2 -m opgraph replay "$G" --device cuda --limit "$LIMIT" -o "$OUT/replay_2gpu.jsonl" -q
$PY - "$OUT" <<'PYEOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
s = {n: float((out / f"{n}.s").read_text()) for n in ("fixed_1gpu", "full_1gpu", "fixed_2gpu", "full_2gpu")}
res = {n: [json.loads(l) for l in (out / f"replay_{n}.jsonl").read_text().splitlines() if l.strip()] for n in ("1gpu", "2gpu")}
ok = {n: sum(r["status"] == "ok" for r in rs) for n, rs in res.items()}
summary = {
    "seconds": s,
    "configs": {n: len(rs) for n, rs in res.items()},
    "ok": ok,
    "same_configs": sorted(r["key"] for r in res["1gpu"]) == sorted(r["key"] for r in res["2gpu"]),
    "speedup_end_to_end": s["full_1gpu"] / s["full_2gpu"],
    "speedup_replay": (s["full_1gpu"] - s["fixed_1gpu"]) / (s["full_2gpu"] - s["fixed_2gpu"]),
}
(out / "replay_speedup.json").write_text(json.dumps(summary, indent=1) + "\n")
print(json.dumps(summary, indent=1))
PYEOF
rm -f "$OUT"/*.s
ls -la "$OUT"
