#!/usr/bin/env bash
# Every fault scenario of configs/faults-*.ini next to its fault-free
# baseline (loco launch writes report.md / report.html in each run dir),
# then one table: each fault's cycle with its detection and recovery,
# how far the run was held past train.steps, extra wall time, final loss
# against the baseline and the verdict. docs/EXPERIMENTS.md records runs.
# Usage: scripts/experiment-faults.sh [--hog] [--steps N] [OUT_DIR]
#   --hog      a busy loop on every core beside the runs (a CPU-hogging neighbour)
#   --steps N  train.steps for every scenario (default: as shipped, 150)
# Exits non-zero when a scenario did not PASS.
set -euo pipefail
cd "$(dirname "$0")/.."
hog=0
steps=()
while [ $# -gt 0 ]; do
  case $1 in
    --hog) hog=1; shift ;;
    --steps) steps=(--set "train.steps=$2"); shift 2 ;;
    *) break ;;
  esac
done
out=${1:-runs/faults}
loco=${LOCO_BIN:-build/loco}
mkdir -p "$out"
hogs=()
stop_hogs() { [ ${#hogs[@]} -eq 0 ] || kill "${hogs[@]}" 2>/dev/null || true; }
trap stop_hogs EXIT
if [ "$hog" = 1 ]; then
  for _ in $(seq "$(nproc)"); do
    (while :; do :; done) &
    hogs+=($!)
  done
fi
status=0
run() { # name config extra...
  local name=$1 cfg=$2
  shift 2
  rm -rf "${out:?}/$name"
  if "$loco" launch "$cfg" --set run.dir="$out/$name" ${steps[@]+"${steps[@]}"} "$@" \
    >"$out/$name.log" 2>&1; then
    echo "$name: $(grep -a 'verdict:' "$out/$name.log" | tail -1)"
  else
    echo "$name: FAILED: $(grep -a 'verdict:' "$out/$name.log" | tail -1) (see $out/$name.log)"
    status=1
  fi
}
names=()
for cfg in configs/faults-*.ini; do
  name=$(basename "$cfg" .ini)
  name=${name#faults-}
  names+=("$name")
  run "$name" "$cfg"
done
# The freezes, timed by the run: siteB sleeps until the others are 30 steps on.
names+=(freeze freeze-200ms-rtt)
run freeze configs/faults-kill.ini --set faults.kill= --set faults.freeze=siteB@40+60000 \
  --set faults.thaw_after_steps=30
run freeze-200ms-rtt configs/faults-kill.ini --set faults.kill= \
  --set faults.freeze=siteB@40+60000 --set faults.thaw_after_steps=30 \
  --set net.wan_delay_ms=100 --set net.wan_jitter_ms=20 --set faulttol.heartbeat_ms=100 \
  --set faulttol.phi_pause_ms=1000 --set faulttol.timeout_ms=3000
stop_hogs
echo
echo "| scenario | faults: cycle (detection s / recovery s) | held past train.steps | extra wall time | final loss vs baseline | verdict |"
echo "|---|---|---|---|---|---|"
for r in "${names[@]}"; do
  md="$out/$r/report.md"
  [ -f "$md" ] || { echo "| $r | no report | | | | |"; continue; }
  faults=$(awk -F'|' '/^\| [0-9]+ \|/ {gsub(/^ +| +$/,"",$3); gsub(/ /,"",$7); gsub(/ /,"",$9); gsub(/^ +| +$/,"",$10); printf "%s%s: %s (%s / %s)", sep, $3, $10, $7, $9; sep="; "}' "$md")
  held=$(grep -a '^- \*\*Run extended' "$md" | sed -n 's/.*moved from \([0-9]*\) to \([0-9]*\).*/\1 → \2/p')
  extra=$(grep -a '^- \*\*Wall time' "$md" | sed -n 's/.*extra \([^;]*\)$/\1/p')
  loss=$(grep -a '^- \*\*Relative difference' "$md" | sed -n 's/.*\*\*: \([^,]*\),.*/\1/p')
  verdict=$(grep -a '^\*\*Verdict' "$md" | sed 's/\*//g; s/Verdict: //')
  echo "| $r | $faults | ${held:-no} | $extra | $loss | $verdict |"
done
exit $status
