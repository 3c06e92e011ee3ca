#!/usr/bin/env bash
# A chaos campaign (docs/EXPERIMENTS.md, "Chaos with and without a CPU hog"):
# scripts/chaos.sh for consecutive seeds, each seed quiet and/or beside CPU
# hogs, one fault-free baseline shared by all, and a markdown table with
# one row per run (result, exits, hashes, steps committed twice, final
# loss, wall time) appended to OUT/table.md as each run ends, so a campaign
# cut short still leaves the rows it finished.
#
# The loco binary is copied to OUT/loco first: rebuilding the tree during a
# campaign of hours does not change the binary its later seeds run.
#
# Usage: scripts/chaos-campaign.sh --seeds FIRST-LAST [--hog N] [--both]
#          [--out DIR] [-- chaos.sh options...]
#   --hog N    hogs for the loaded runs (default 4)
#   --both     each seed loaded (--hog N) and quiet; without it only loaded
#              when --hog is given, only quiet otherwise
# Exit status: 0 when every run passed, 1 when one failed, 2 on a usage error.
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

first="" last="" hog=0 hog_given=0 both=0 out=runs/chaos-campaign
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --seeds)
      [[ ${2:-} =~ ^([0-9]+)-([0-9]+)$ ]] || { echo "chaos-campaign.sh: --seeds wants FIRST-LAST, got '${2:-}'" >&2; exit 2; }
      first=${BASH_REMATCH[1]} last=${BASH_REMATCH[2]}; shift 2 ;;
    --hog) hog=${2:?}; hog_given=1; shift 2 ;;
    --both) both=1; shift ;;
    --out) out=${2:?}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "chaos-campaign.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$first" ] || { echo "chaos-campaign.sh: --seeds FIRST-LAST is required" >&2; exit 2; }
[ "$first" -le "$last" ] || { echo "chaos-campaign.sh: --seeds $first-$last: FIRST > LAST" >&2; exit 2; }
[ "$both" = 1 ] && [ "$hog_given" = 0 ] && hog=4
loads=("$hog")
[ "$both" = 1 ] && loads=("$hog" 0)

src=${LOCO_BIN:-build/loco}
[ -x "$src" ] || { echo "chaos-campaign.sh: no loco binary at $src (make, or set LOCO_BIN)" >&2; exit 2; }
mkdir -p "$out"
cp "$src" "$out/loco"
export LOCO_BIN=$(realpath "$out/loco")
table=$out/table.md
if [ ! -f "$table" ]; then
  {
    echo "| seed | hog | result | all exited 0 | hashes agree | steps committed twice | final val loss | wall |"
    echo "|---|---|---|---|---|---|---|---|"
  } >"$table"
fi

field() { sed -n "s/^- $1: \(.*\)$/\1/p" "$2" | head -n 1; }
failed=0 runs=0
for ((s = first; s <= last; s++)); do
  for h in "${loads[@]}"; do
    dir=$out/s$s-hog$h
    base=()
    [ -f "$out/baseline/events.jsonl" ] && base=(--baseline "$out/baseline")
    echo "chaos-campaign: seed $s, hog $h -> $dir"
    scripts/chaos.sh --seed "$s" --hog "$h" --out "$dir" "${base[@]}" "${extra[@]}" >"$dir.log" 2>&1
    rc=$?
    # A usage error (say a config the baseline was not run with) is the
    # same for every seed: stop instead of failing them all.
    [ "$rc" = 2 ] && { echo "chaos-campaign: chaos.sh refused its arguments (see $dir.log)" >&2; exit 2; }
    # The first run's fault-free baseline serves the rest.
    [ -d "$out/baseline" ] || { [ -d "$dir/baseline" ] && cp -r "$dir/baseline" "$out/baseline"; }
    sum=$dir/summary.md
    runs=$((runs + 1))
    if [ ! -f "$sum" ]; then
      echo "| $s | $h | FAIL: no summary (exit $rc, see $dir.log) | | | | | |" >>"$table"
      failed=$((failed + 1)); continue
    fi
    res=$(field result "$sum")
    [ "$rc" = 0 ] || failed=$((failed + 1))
    all0=$(field "every island's last process exited 0" "$sum" | cut -d' ' -f1)
    agree=$(field "θ_global hashes agree" "$sum" | sed 's/ (last commit: outer step \([0-9]*\) of.*/ (step \1)/')
    twice=$(field "outer steps committed with two hashes" "$sum")
    loss=$(field "final loss (validation, mean over islands)" "$sum" | cut -d';' -f1)
    wall=$(field "wall time of the chaos run" "$sum")
    echo "| $s | $h | $res | $all0 | $agree | $twice | $loss | $wall |" | tee -a "$table"
  done
done
echo "chaos-campaign: $((runs - failed)) of $runs passed; table in $table"
[ "$failed" = 0 ]
