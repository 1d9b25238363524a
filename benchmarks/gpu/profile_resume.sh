#!/usr/bin/env bash
# Measure the points a catalog profile lacks against the current sweep (`opgraph profile --resume`):
# points a budget-stopped sweep left, and series the sweep gained since the profile was measured.
#
# Run from the repo root on the GPU machine:
#   NAME=h200 OUT=/path/to/out bash benchmarks/gpu/profile_resume.sh
# Writes under $OUT: NAME.profile.json (the catalog profile's points plus the new ones), new.parts.jsonl
# (only the points measured now) and resume.log (provenance and the sweep's lines). The catalog
# profile's points become the parts file the sweep resumes from, keyed as the current sweep keys them
# (the same op gives the same key), so nothing it holds is measured again.
set -uo pipefail
source benchmarks/gpu/env.sh
NAME=${NAME:-h100-sxm}
BUDGET_S=${BUDGET_S:-240}
PROFILE="$OUT/$NAME.profile.json"
LOG="$OUT/resume.log"
{
  echo "# opgraph profile --resume: $(date -u +%FT%TZ)"
  timeout 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1
  echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
} 2>&1 | tee "$LOG"
timeout 60 $PY - "hardware/catalog/$NAME.profile.json" "$PROFILE.parts.jsonl" <<'PYEOF' 2>&1 | tee -a "$LOG"
import json, sys
from hardware import load_profile
from validators.profile import sweep_key, sweep_points
prof = load_profile(sys.argv[1])
plan = {sp.key for sp in sweep_points("cuda")}
renamed = 0
with open(sys.argv[2], "w") as f:
    f.write(json.dumps({"header": prof.device.model_dump(mode="json")}) + "\n")
    for p in prof.points:
        key = sweep_key(p)
        if key not in plan:  # the IR may have renamed the op since: its definition derived again
            op = type(p.op).model_validate({**p.op.model_dump(), "definition": ""})
            if sweep_key(q := p.model_copy(update={"op": op})) in plan:
                p, key, renamed = q, sweep_key(q), renamed + 1
        f.write(json.dumps({"key": key, "point": p.model_dump(mode="json")}) + "\n")
print(f"parts file from {sys.argv[1]}: {len(prof.points)} points ({renamed} renamed by the IR since)")
PYEOF
old=$(wc -l < "$PROFILE.parts.jsonl")
timeout -k 10 $((BUDGET_S + 50)) $PY -m opgraph profile --device cuda --resume --budget-s "$BUDGET_S" \
  -o "$PROFILE" --hardware "$NAME" 2>&1 | grep -v 'done earlier' | tail -n 60 | tee -a "$LOG"
echo "sweep: exit ${PIPESTATUS[0]}" | tee -a "$LOG"
tail -n +$((old + 1)) "$PROFILE.parts.jsonl" > "$OUT/new.parts.jsonl"
echo "new points: $(wc -l < "$OUT/new.parts.jsonl")" | tee -a "$LOG"
rm -f "$PROFILE.parts.jsonl"
