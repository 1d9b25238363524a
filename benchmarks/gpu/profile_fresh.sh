#!/usr/bin/env bash
# The whole sweep from nothing, as a user runs it (`opgraph profile --device cuda -o NAME.profile.json`),
# timed: issue 18 asks for at most 15 minutes on one GPU. The device tool stops a command at 10 minutes,
# so the sweep may run in two calls: the second gets the first's parts file and resumes it.
#
# Run from the repo root on the GPU machine:
#   NAME=h100-sxm BUDGET_S=520 OUT=/path/to/out bash benchmarks/gpu/profile_fresh.sh
#   PARTS=fresh/h100-sxm.profile.json.parts.jsonl NAME=h100-sxm OUT=... bash benchmarks/gpu/profile_fresh.sh
# Writes under $OUT: NAME.profile.json, NAME.profile.json.parts.jsonl.gz (the points as they streamed)
# and fresh.log (provenance, every point's line, each run's seconds).
set -uo pipefail
source benchmarks/gpu/env.sh
NAME=${NAME:-h100-sxm}
BUDGET_S=${BUDGET_S:-520}
PROFILE="$OUT/$NAME.profile.json"
LOG="$OUT/fresh.log"
RESUME=()
if [ -n "${PARTS:-}" ]; then
  cp "$PARTS" "$PROFILE.parts.jsonl" && RESUME=(--resume)
  [ -f "${PARTS%.parts.jsonl}.log" ] && cp "${PARTS%.parts.jsonl}.log" "$LOG"
fi
{
  echo "# opgraph profile --device cuda ${RESUME[*]}: $(date -u +%FT%TZ)"
  timeout 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1
  echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
} 2>&1 | tee -a "$LOG"
t0=$(date +%s)
timeout -k 10 $((BUDGET_S + 50)) $PY -m opgraph profile --device cuda "${RESUME[@]}" --budget-s "$BUDGET_S" \
  -o "$PROFILE" --hardware "$NAME" 2>&1 | grep -v -e 'done earlier' -e '^USDT:' >> "$LOG"
rc=${PIPESTATUS[0]}
echo "sweep: exit $rc after $(( $(date +%s) - t0 )) s (the process, from its start: torch's import included)" | tee -a "$LOG"
tail -n 3 "$LOG"
gzip -kf "$PROFILE.parts.jsonl"
rm -f "$PROFILE.parts.jsonl"
exit "$rc"
