#!/usr/bin/env bash
# DiLoCo (4 islands, H=50, int8) against data-parallel training of the same
# model on the same total tokens (dp=4, the same per-rank batch and steps):
# final validation loss of each and the communication reduction. Writes
# runs/experiment-diloco-STEPS/summary.md. STEPS (default 300) inner steps;
# about 2 minutes per 100 steps on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${STEPS:-300}
out=runs/experiment-diloco-$steps
rm -rf "$out"
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
common=(--set run.eval_every=0 --set run.log_every=50 --set run.threads=1 --set run.eval_batches=50
        --set train.steps="$steps")

echo "== DiLoCo: 4 islands, outer.H=50, int8 + zstd, over TLS with 50 ms / 1 Gbit/s links"
build/loco launch configs/multisite-4.ini "${common[@]}" --set run.dir="$out/diloco" \
  | tee "$out/diloco.log" | grep -E "outer step|val loss|launch:" || true

echo "== data parallel: mpirun -np 4, dp=4 (all-reduce of fp32 gradients every step)"
mpirun --allow-run-as-root --oversubscribe -np 4 build/loco train configs/multisite-4.ini \
  "${common[@]}" --set parallel.dp=4 --set run.dir="$out/dp" 2>&1 | tee "$out/dp.log" \
  | grep -E "val loss|step   300" || true

python3 - "$out" "$steps" <<'PY'
import json, sys, glob
out = sys.argv[1]
def last_val(path):
    v = [json.loads(l) for l in open(path) if '"val_loss"' in l]
    return v[-1]["val_loss"]
dil = last_val(f"{out}/diloco/siteA/metrics.jsonl")
dp = last_val(f"{out}/dp/metrics.jsonl")
outer = [json.loads(l) for l in open(f"{out}/diloco/siteA/outer.jsonl")]
sent = sum(o["bytes_sent"] for o in outer)               # one island, to its 3 peers
raw_fp32 = outer[0]["bytes_raw"] / 3                     # 4P: one fp32 copy of the model
steps = int(sys.argv[2])
n = 4
dp_sent = steps * 2 * (n - 1) / n * raw_fp32             # ring all-reduce, per rank per step
lines = [
    "| run | final val loss | bytes sent per rank/island | vs data parallel |",
    "|---|---|---|---|",
    f"| data parallel (dp=4, fp32 all-reduce each step) | {dp:.4f} | {dp_sent/1e6:.1f} MB | 1x |",
    f"| DiLoCo (4 islands, H=50, int8+zstd) | {dil:.4f} | {sent/1e6:.2f} MB | {dp_sent/sent:.0f}x less |",
    "",
    f"DiLoCo's loss is {100*(dil-dp)/dp:+.2f}% relative to data parallel.",
]
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
