#!/usr/bin/env bash
# Measure the H100 SXM device profile that `-H h100` predicts from (issue 18 items 1 and 4).
#
# Run from the repo root on the GPU machine (the wheels of pydantic/simpy/nvidia-ml-py installed
# before, this script installs nothing):
#   OUT=/path/to/out bash benchmarks/gpu/profile_h100.sh
# Writes under $OUT: h100-sxm.profile.json (the profile), h100-sxm.profile.parts.tar.gz (the
# streamed points, JSONL), profile.log (provenance, the sweep's last lines, a per-regime summary).
# The sweep stops cleanly at BUDGET_S (default 420 s) with a valid profile; every step has a timeout
# guard (about 7.5 minutes in all, 9 at worst). Points stream to $OUT as they complete, so a kill
# loses nothing measured. DEVICE=cpu runs the tiny CPU sweep
# (to test this script without a GPU). NAME (default h100-sxm) names the files and the catalog
# device the profile predicts for (h200 on an H200).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
DEVICE=${DEVICE:-cuda}
BUDGET_S=${BUDGET_S:-420}
NAME=${NAME:-h100-sxm}
PROFILE="$OUT/$NAME.profile.json"
LOG="$OUT/profile.log"
HW_ARG=()
[ "$DEVICE" = cpu ] || HW_ARG=(--hardware "$NAME")

{
  echo "# opgraph profile: $(date -u +%FT%TZ)"
  timeout 10 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | head -1
  echo "cpu: $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)"
} 2>&1 | tee "$LOG"

t0=$(date +%s)
# The sweep: its own budget stops it cleanly; the timeout is the guard for a hung device.
timeout -k 10 $((BUDGET_S + 50)) $PY -m opgraph profile --device "$DEVICE" --budget-s "$BUDGET_S" \
  -o "$PROFILE" "${HW_ARG[@]}" 2>&1 | tail -n 40 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "sweep: exit $rc after $(( $(date +%s) - t0 )) s" | tee -a "$LOG"

# Killed or failed before writing the profile: rebuild it from the streamed points.
if ! timeout 20 $PY -c 'import sys; from hardware import load_profile; load_profile(sys.argv[1])' "$PROFILE" 2>>"$LOG"; then
  echo "profile missing or unreadable: rebuilding it from the parts file" | tee -a "$LOG"
  timeout 30 $PY -m opgraph profile --device "$DEVICE" --from-parts -o "$PROFILE" "${HW_ARG[@]}" 2>&1 | tee -a "$LOG"
fi

# Per-regime summary: points, size range, efficiency against the datasheet roofline.
timeout 30 $PY - "$PROFILE" "$DEVICE" "$NAME" <<'PYEOF' 2>&1 | tee -a "$LOG"
import math, statistics, sys
from hardware import load_hardware, load_profile
from hardware.models.profile import profile_features, roofline_seconds
prof = load_profile(sys.argv[1])
hw = load_hardware(prof.device.hardware or "h100")
d = prof.device
print(f"device {d.name} ({d.hardware}) driver {d.driver} cuda {d.cuda} torch {d.torch} sm clock {d.sm_clock_mhz} "
      f"(max {d.max_sm_clock_mhz}) MHz host {d.host_cpu}")
print(f"{len(prof.points)} points of {prof.planned} planned, complete={prof.complete}; launch {prof.launch_us} us; "
      f"host per aten call {prof.aten_issue_us} us; notes: {'; '.join(prof.notes) or '-'}")
by = {}
for p in prof.points:
    f = profile_features(p.op)
    if f is None or p.tag:
        continue
    by.setdefault((f.regime, p.op.dtype.value), []).append((f.size, roofline_seconds(p.op, hw) / max(p.seconds, 1e-12), p))
print(f"{'regime':<24} {'dtype':<5} {'pts':>4} {'size range':>22} {'eff min':>8} {'eff med':>8} {'eff max':>8} {'host us':>8}")
for (regime, dt), xs in sorted(by.items()):
    effs = [e for _, e, _ in xs]
    hosts = [p.host_s * 1e6 for _, _, p in xs if p.host_s is not None]
    lo, hi = min(s for s, _, _ in xs), max(s for s, _, _ in xs)
    print(f"{regime:<24} {dt:<5} {len(xs):>4} {2**lo:>10.4g}..{2**hi:<10.4g} {min(effs):>8.3g} "
          f"{statistics.median(effs):>8.3g} {max(effs):>8.3g} {statistics.median(hosts) if hosts else math.nan:>8.3g}")
PYEOF

# The streamed points, compressed (the profile JSON holds every valid one too).
if [ -f "$PROFILE.parts.jsonl" ]; then
  tar -czf "$OUT/$NAME.profile.parts.tar.gz" -C "$OUT" "$(basename "$PROFILE").parts.jsonl" && rm -f "$PROFILE.parts.jsonl"
fi
echo "total: $(( $(date +%s) - t0 )) s" | tee -a "$LOG"
ls -la "$OUT" | tee -a "$LOG"
