#!/usr/bin/env bash
# The mixture-of-experts experiments of docs/PERFORMANCE.md ("mixture of
# experts"), on the tiny model and the default data (make run's):
#   1. routing at capacity factors 1.0, 1.25 and 2.0 (8 experts, top-2, every
#      block MoE): tokens per expert and the dropped fraction of each MoE layer
#      at the last step, from metrics.jsonl;
#   2. quality: the dense tiny model, 8 experts top-1 (the same active
#      parameters per token as dense: one GPT-2 MLP) and 8 experts top-2
#      (twice them), same tokens, same steps: train and validation loss.
# Usage: scripts/moe-experiments.sh [OUT_DIR]   (STEPS=200 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/loco-moe-experiments}
steps=${STEPS:-200}
mkdir -p "$out"
make -s -j2 build/loco
common=(--set "train.steps=$steps" --set "run.eval_every=$steps" --set run.log_every=50
        --set run.threads=2 --set run.ckpt_every=0)
run() {
  local name=$1
  shift
  rm -rf "${out:?}/$name"
  echo "run $name: $*" >&2
  build/loco train configs/tiny.ini "${common[@]}" --set "run.dir=$out/$name" "$@" \
    >"$out/$name.log" 2>&1
}
moe=(--set model.n_experts=8)
for f in 1.0 1.25 2.0; do
  run "capacity-$f" "${moe[@]}" --set model.top_k=2 --set "model.capacity_factor=$f"
done
run dense
run moe-top1 "${moe[@]}" --set model.top_k=1
run moe-top2 "${moe[@]}" --set model.top_k=2
python3 - "$out" "$steps" <<'EOF'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
def records(name):
    with open(f"{out}/{name}/metrics.jsonl") as f:
        return [json.loads(l) for l in f if l.strip()]
print(f"\n### routing at the last step ({steps}), 8 experts, top-2\n")
print("| capacity factor | block | tokens per expert | dropped |")
print("|---|---|---|---|")
for f in ("1.0", "1.25", "2.0"):
    last = [r for r in records(f"capacity-{f}") if "loss" in r][-1]
    blocks = sorted({k.split(".")[1] for k in last if k.startswith("moe.")}, key=int)
    for b in blocks:
        tpe = last[f"moe.{b}.tokens_per_expert"]
        print(f"| {f} | {b} | {' '.join(map(str, tpe))} | {100 * last[f'moe.{b}.dropped_frac']:.1f}% |")
print(f"\n### quality after {steps} steps (same tokens)\n")
print("| model | train loss (mean of the last 10 steps) | val loss | step time s |")
print("|---|---|---|---|")
for name in ("dense", "moe-top1", "moe-top2"):
    rs = records(name)
    train = [r for r in rs if "loss" in r]
    val = [r["val_loss"] for r in rs if "val_loss" in r]
    tail = train[-10:]
    print(f"| {name} | {sum(r['loss'] for r in tail) / len(tail):.4f} | {val[-1]:.4f} | "
          f"{sum(r['step_s'] for r in tail) / len(tail):.3f} |")
EOF
