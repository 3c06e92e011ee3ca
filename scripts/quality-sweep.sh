#!/usr/bin/env bash
# The quality lab's sweeps (docs/QUALITY.md): one factor at a time around
# configs/lab.ini (4 islands, H = 50, Nesterov 0.7 / 0.9, int4), each
# setting over SEEDS seeds with `loco lab`, then the table and the SVG plot
# of loss gap against traffic reduction per sweep (scripts/quality-plot.py).
#
# Usage: scripts/quality-sweep.sh [--seeds N] [--out DIR] [--only NAME,...]
#          [--jobs J] [-- extra loco lab options, e.g. --set train.steps=2000]
#   sweeps: H, outer, islands, codec, streaming, best
#   --jobs J  sweeps run J at a time (each `loco lab` is one thread)
# Writes OUT/NAME.json, OUT/NAME.log, OUT/NAME.md and OUT/NAME.svg
# (default OUT: runs/quality). The loco binary is copied to OUT first.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

seeds=3 out=runs/quality only="" jobs=1
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --seeds) seeds=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --only) only=${2:?}; shift 2 ;;
    --jobs) jobs=${2:?}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "quality-sweep.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
cp "${LOCO_BIN:-build/loco}" "$out/loco"
loco=$out/loco

# name | title | loco lab arguments
sweeps=(
  "H|H: inner steps between outer steps (Nesterov 0.7/0.9, int4)|--sweep outer.H=10,25,50,100,250"
  "outer|outer optimizer at H = 50, int4 (averaging, and Nesterov's lr x momentum)|--sweep outer.optimizer=average --set outer.H=50 ; --sweep outer.lr=0.3,0.7,1.0 --sweep outer.momentum=0.5,0.9"
  "islands|M islands at H = 50, int4 (Nesterov 0.7/0.9)|--sweep islands=2,4,8"
  "codec|codecs at H = 50 (Nesterov 0.7/0.9; top-k at 2 bits)|--sweep compress.codec=none,int8,int4,fp4 ; --set compress.codec=topk --sweep compress.topk=1,0.1,0.03,0.01"
  "streaming|Streaming DiLoCo at H = 50, int4: fragments, overlap, alpha|--sweep outer.fragments=1,2 ; --set outer.fragments=2 --sweep outer.overlap=1,5 --sweep outer.merge_alpha=0,0.5"
  "best|toward 1000x: damped outer steps (Nesterov 0.7/0.5, averaging) with int4 or 2-bit at H = 100 and 250|--set outer.momentum=0.5 --set compress.topk=1 --sweep outer.H=100,250 --sweep compress.codec=int4,topk ; --set outer.optimizer=average --set compress.topk=1 --sweep outer.H=100,250 --sweep compress.codec=int4,topk"
)

want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

run_sweep() {
  local name=$1 args=$2 part=0 files=()
  # ";" separates parts of one sweep that are not one product
  IFS=';' read -r -a parts <<<"$args"
  for p in "${parts[@]}"; do
    read -r -a a <<<"$p"
    "$loco" lab configs/lab.ini --seeds "$seeds" "${a[@]}" "${extra[@]}" \
      --json "$out/$name.$part.json" >>"$out/$name.log" 2>&1
    # the part's --set values lead its labels in the table and the plot
    local prefix="" i
    for ((i = 0; i + 1 < ${#a[@]}; i++)); do
      [ "${a[i]}" = --set ] && prefix+="${prefix:+,}${a[i + 1]}"
    done
    files+=("$prefix${prefix:+@}$out/$name.$part.json")
    part=$((part + 1))
  done
  echo "${files[@]}"
}

pids=()
for s in "${sweeps[@]}"; do
  IFS='|' read -r name title args <<<"$s"
  want "$name" || continue
  : >"$out/$name.log"
  (
    files=$(run_sweep "$name" "$args")
    # shellcheck disable=SC2086
    python3 scripts/quality-plot.py --svg "$out/$name.svg" --md "$out/$name.md" \
      --title "$title" $files >/dev/null
    echo "quality-sweep: $name done: $out/$name.md, $out/$name.svg"
  ) &
  pids+=($!)
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
