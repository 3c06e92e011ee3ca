#!/usr/bin/env bash
# Every fault scenario of configs/faults-*.ini next to its fault-free
# baseline (loco launch writes report.md / report.html in each run dir),
# then one table: detection, recovery, extra wall time and final loss
# against the baseline. docs/EXPERIMENTS.md records a run of it.
# Usage: scripts/experiment-faults.sh [OUT_DIR] (default runs/faults)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/faults}
loco=${LOCO_BIN:-build/loco}
mkdir -p "$out"
run() { # name config extra...
  local name=$1 cfg=$2
  shift 2
  rm -rf "$out/$name"
  if "$loco" launch "$cfg" --set run.dir="$out/$name" "$@" >"$out/$name.log" 2>&1; then
    echo "$name: $(grep -a 'verdict:' "$out/$name.log" | tail -1)"
  else
    echo "$name: FAILED (see $out/$name.log)"
  fi
}
run kill configs/faults-kill.ini
run freeze configs/faults-kill.ini --set faults.kill= --set faults.freeze=siteB@40+2500
run freeze-200ms-rtt configs/faults-kill.ini --set faults.kill= --set faults.freeze=siteB@40+4000 \
  --set net.wan_delay_ms=100 --set net.wan_jitter_ms=20 --set faulttol.heartbeat_ms=100 \
  --set faulttol.phi_pause_ms=1000 --set faulttol.timeout_ms=3000
run partition configs/faults-partition.ini --set faulttol.timeout_ms=1500
run corrupt configs/faults-corrupt.ini
run straggler configs/faults-straggler.ini
run coordinator configs/faults-coordinator.ini
run link configs/faults-link.ini
echo
echo "| scenario | faults (detection s / recovery s) | extra wall time | final loss vs baseline | verdict |"
echo "|---|---|---|---|---|"
for r in kill freeze freeze-200ms-rtt partition corrupt straggler coordinator link; do
  md="$out/$r/report.md"
  [ -f "$md" ] || { echo "| $r | no report | | | |"; continue; }
  faults=$(awk -F'|' '/^\| [0-9]+ \|/ {gsub(/ /,"",$3); gsub(/ /,"",$7); gsub(/ /,"",$9); printf "%s%s (%s / %s)", sep, $3, $7, $9; sep="; "}' "$md")
  extra=$(grep -a '^- \*\*Wall time' "$md" | sed -n 's/.*extra \([^;]*\)$/\1/p')
  loss=$(grep -a '^- \*\*Relative difference' "$md" | sed -n 's/.*\*\*: \([^,]*\),.*/\1/p')
  verdict=$(grep -a '^\*\*Verdict' "$md" | sed 's/\*//g; s/Verdict: //')
  echo "| $r | $faults | $extra | $loss | $verdict |"
done
