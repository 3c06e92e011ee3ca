#!/usr/bin/env bash
# DiLoCo (4 islands, H=50, int8) against data-parallel training of the same
# model on the same total tokens (dp=4, the same per-rank batch and steps):
# final validation loss of each and the communication reduction. Writes
# runs/experiment-diloco-STEPS[-TAG]/summary.md. About 2 minutes per 100
# steps on 2 idle cores.
#
# Environment:
#   STEPS=300        inner steps of both runs
#   TAG=name         suffix of the output folder (runs/experiment-diloco-STEPS-TAG)
#   DILOCO_SET="..." extra arguments for the DiLoCo run only, e.g.
#                    "--set outer.optimizer=average --set outer.H=25 --set compress.codec=int4"
#                    (docs/EXPERIMENTS.md's within-2% setting adds
#                    "--set train.batch_size=64 --set train.warmup_steps=100", with
#                    DP_SET="--set train.batch_size=64")
#   DP_SET="..."     extra arguments for the data-parallel run only
#   DP_FROM=dir      reuse the data-parallel run in dir/dp (same STEPS and DP_SET)
#                    instead of training it again
#   DP_LOSS=x        take the data-parallel final val loss as x (an earlier run of
#                    the same STEPS; the bytes need no run) instead of training it
#   LOCO=path        the loco binary (default build/loco)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-300}
loco=${LOCO:-build/loco}
out=runs/experiment-diloco-$steps${TAG:+-$TAG}
read -r -a diloco_set <<<"${DILOCO_SET:-}"
read -r -a dp_set <<<"${DP_SET:-}"
rm -rf "$out"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--set run.eval_every=0 --set run.log_every=50 --set run.threads=1 --set run.eval_batches=50
        --set train.steps="$steps")

echo "== DiLoCo: 4 islands, configs/multisite-4.ini ${DILOCO_SET:-} (TLS, 50 ms / 1 Gbit/s links)"
"$loco" launch configs/multisite-4.ini "${common[@]}" "${diloco_set[@]}" --set run.dir="$out/diloco" \
  | tee "$out/diloco.log" | grep -E "outer step|val loss|launch:" || true

if [[ -n "${DP_LOSS:-}" ]]; then
  echo "== data parallel: final val loss $DP_LOSS from an earlier run (not trained again)"
elif [[ -n "${DP_FROM:-}" ]]; then
  echo "== data parallel: reused from $DP_FROM/dp"
  cp -r "$DP_FROM/dp" "$out/dp"
else
  echo "== data parallel: mpirun -np 4, dp=4 (all-reduce of fp32 gradients every step) ${DP_SET:-}"
  mpirun --allow-run-as-root --oversubscribe -np 4 "$loco" train configs/multisite-4.ini \
    "${common[@]}" "${dp_set[@]}" --set parallel.dp=4 --set run.dir="$out/dp" 2>&1 | tee "$out/dp.log" \
    | grep -E "val loss|step +$steps" || true
fi

python3 - "$out" "$steps" "${DILOCO_SET:-}" "${DP_LOSS:-}" <<'PY'
import json, sys, glob, os
out = sys.argv[1]
def last_val(path):
    v = [json.loads(l) for l in open(path) if '"val_loss"' in l]
    return v[-1]["val_loss"]
dil = last_val(f"{out}/diloco/siteA/metrics.jsonl")
dp = float(sys.argv[4]) if sys.argv[4] else last_val(f"{out}/dp/metrics.jsonl")
outer = [json.loads(l) for l in open(f"{out}/diloco/siteA/outer.jsonl")]
sent = sum(o["bytes_sent"] for o in outer)               # one island, to its 3 peers
raw_fp32 = outer[0]["bytes_raw"] / 3                     # 4P: one fp32 copy of the model
steps = int(sys.argv[2])
n = 4
dp_sent = steps * 2 * (n - 1) / n * raw_fp32             # ring all-reduce, per rank per step
# Every island's bytes (siteA's is the figure above; they differ under rsag).
per_site = {}
for f in sorted(glob.glob(f"{out}/diloco/site*/outer.jsonl")):
    per_site[os.path.basename(os.path.dirname(f))] = sum(
        json.loads(l)["bytes_sent"] for l in open(f))
label = sys.argv[3] or "H=50, int8+zstd, Nesterov 0.7/0.9"
lines = [
    "| run | final val loss | bytes sent per rank/island | vs data parallel |",
    "|---|---|---|---|",
    f"| data parallel (dp=4, fp32 all-reduce each step) | {dp:.4f} | {dp_sent/1e6:.1f} MB | 1x |",
    f"| DiLoCo (4 islands, {label}) | {dil:.4f} | {sent/1e6:.2f} MB | {dp_sent/sent:.0f}x less |",
    "",
    f"DiLoCo's loss is {100*(dil-dp)/dp:+.2f}% relative to data parallel; "
    f"{len(outer)} outer steps; reduction per island: "
    + ", ".join(f"{k} {dp_sent/v:.0f}x" for k, v in per_site.items() if v > 0) + ".",
]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
