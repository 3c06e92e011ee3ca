#!/usr/bin/env bash
# The straggler experiment (docs/EXPERIMENTS.md, "A straggler: lockstep,
# time-based and quorum outer steps"): three islands, one slowed FACTOR times
# (faults.slow), trained
#   lockstep  outer.sync = steps: an outer step every outer.H inner steps;
#             the fast islands wait for the slow one at every step;
#   time      outer.sync = time with outer.period_s = the lockstep run's
#             wall time per outer step (start-up left out): the same number
#             of outer steps in about the same wall time, each island as
#             many inner steps as it manages;
#   tokens    lockstep again, as many outer steps as it takes to train
#             about the tokens the time run trained (equal tokens);
#   drop      lockstep with faulttol.straggler_policy = drop: an island
#             not ready 50 ms after the first is left out of the step and
#             catches up by state transfer (its work lost);
#   quorum    lockstep with outer.quorum = 0.6: a step goes once two of the
#             three islands are ready; the late one fetches it and folds
#             its work, damped by 1/(1 + steps late), into its next
#             contribution.
# For each: wall seconds, outer steps, inner steps per island, tokens
# trained, the fast islands' compute utilisation (outer.jsonl: the share
# of wall time not spent waiting on the outer loop), the final validation
# loss of θ_global and the bytes each island sent. Prints a markdown table.
#
# Usage: scripts/experiment-straggler.sh [--out DIR] [--factor F]
#          [--outer N] [-- loco launch --set options...]
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

out=runs/straggler factor=3 outer=8
extra=()
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?}; shift 2 ;;
    --factor) factor=${2:?}; shift 2 ;;
    --outer) outer=${2:?}; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "experiment-straggler.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
loco=${LOCO:-build/loco}
config=configs/faults-kill.ini # three islands, a model that trains in seconds
H=$(sed -n 's/^H *= *//p' "$config")
mkdir -p "$out"

# run NAME STEPS [--set ...]: one launch, its wall time in $out/NAME/wall_s.
run() {
  local name=$1 steps=$2
  shift 2
  rm -rf "${out:?}/$name"
  local t0 t1
  t0=$(date +%s.%N)
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$loco" launch "$config" \
    --no-baseline --set run.dir="$out/$name" --set train.steps="$steps" --set faults.kill= \
    --set faults.slow="siteC*$factor" --set run.eval_every=0 --set run.log_every=100000 \
    ${extra[@]+"${extra[@]}"} "$@" >"$out/$name.log" 2>&1 ||
    { echo "experiment-straggler.sh: the $name run failed: $out/$name.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')" >"$out/$name/wall_s"
}

# summary NAME: one JSON line of what the table shows.
summary() {
  python3 - "$out/$1" "$config" <<'EOF'
import json, re, sys
d, config = sys.argv[1], sys.argv[2]
text = open(config).read()
B = int(re.search(r"^batch_size *= *(\d+)", text, re.M).group(1))
T = int(re.search(r"^seq_len *= *(\d+)", text, re.M).group(1))
sites = ["siteA", "siteB", "siteC"]
row = {"wall_s": float(open(f"{d}/wall_s").read()), "steps": {}, "util": {}, "sent_mb": 0}
for s in sites:
    rec = [json.loads(l) for l in open(f"{d}/{s}/outer.jsonl") if '"outer_step"' in l]
    rec = [r for r in rec if r.get("outer_step", 0) >= 1]
    row["outer"] = max(row.get("outer", 0), max(r["outer_step"] for r in rec))
    row["steps"][s] = max(r["step"] for r in rec)
    u = [r["utilisation"] for r in rec if "utilisation" in r]
    row["util"][s] = sum(u) / len(u)
    row["sent_mb"] += sum(r.get("bytes_sent", 0) for r in rec) / 1e6 / len(sites)
    vals = [json.loads(l) for l in open(f"{d}/{s}/metrics.jsonl") if '"val_loss"' in l]
    row["val_loss"] = vals[-1]["val_loss"]
row["tokens"] = sum(row["steps"].values()) * B * T
# wall seconds per outer step once training runs (start-up left out)
rec = [json.loads(l) for l in open(f"{d}/siteA/outer.jsonl") if '"outer_step"' in l]
w = [r["wall_s"] for r in rec if r.get("outer_step", 0) >= 2 and "wall_s" in r]
row["outer_wall_s"] = sum(w) / len(w) if w else row["wall_s"] / row["outer"]
print(json.dumps(row))
EOF
}

lock_steps=$((outer * H))
run lockstep "$lock_steps"
lock=$(summary lockstep)
period=$(python3 -c "import json; r = json.loads('$lock'); print(f\"{r['outer_wall_s']:.3f}\")")
run time "$lock_steps" --set outer.sync=time --set outer.period_s="$period"
timed=$(summary time)
# lockstep at the time run's tokens: outer steps of H steps on three islands
tok_outer=$(python3 -c "
import json
l, t = json.loads('$lock'), json.loads('$timed')
print(max(1, round(t['tokens'] / l['tokens'] * l['outer'])))")
run tokens $((tok_outer * H))
tokens=$(summary tokens)
run drop "$lock_steps" --set faulttol.straggler_policy=drop --set faulttol.straggler_ms=50
drop=$(summary drop)
run quorum "$lock_steps" --set outer.quorum=0.6 --set outer.grace_s=60
quorum=$(summary quorum)

python3 - "$lock" "$timed" "$tokens" "$period" "$factor" "$drop" "$quorum" <<'EOF'
import json, sys
rows = [("lockstep (outer.sync = steps)", json.loads(sys.argv[1])),
        (f"time (outer.period_s = {sys.argv[4]})", json.loads(sys.argv[2])),
        ("lockstep at the time run's tokens", json.loads(sys.argv[3])),
        ("lockstep, stragglers dropped after 50 ms", json.loads(sys.argv[6])),
        ("quorum (outer.quorum = 0.6), late work folded", json.loads(sys.argv[7]))]
print(f"siteC slowed {sys.argv[5]}x (faults.slow); three islands of configs/faults-kill.ini\n")
print("| mode | wall s | outer steps | inner steps A / B / C | tokens (M) | utilisation A / B / C "
      "| val loss | MB sent per island |")
print("|---|---|---|---|---|---|---|---|")
for name, r in rows:
    s, u = r["steps"], r["util"]
    print(f"| {name} | {r['wall_s']:.1f} | {r['outer']} | {s['siteA']} / {s['siteB']} / "
          f"{s['siteC']} | {r['tokens'] / 1e6:.2f} | {u['siteA']:.1%} / {u['siteB']:.1%} / "
          f"{u['siteC']:.1%} | {r['val_loss']:.4f} | {r['sent_mb']:.2f} |")
EOF
