#!/usr/bin/env bash
# Streaming DiLoCo against blocking DiLoCo, 4 islands of configs/multisite-4.ini
# over TLS with an emulated 1 Gbit/s WAN and 100 ms RTT (50 ms each way, on the
# coordinator's links too). Writes runs/experiment-streaming[-TAG]/summary.md.
#
#   PART=utilisation  compute utilisation and peak bandwidth: blocking DiLoCo
#                     (H = 24) and streaming (F = 2 and 4, overlap 2), int4 and
#                     fp32, STEPS (default 192) steps of batch 16; ~6 minutes
#   PART=quality      final validation loss at docs/EXPERIMENTS.md's within-2%
#                     setting (64 sequences per island, plain averaging, int4,
#                     100 warm-up steps, 300 steps): blocking DiLoCo at H = 24
#                     and streaming F = 4 with overlap TAUS (default "1 2 3 4 5"),
#                     merge_alpha ALPHA (default 0.5); ~7 minutes per run. The
#                     data-parallel reference is DP_LOSS (default 2.1376, the
#                     2026-11-30 run of the same model, tokens and seed).
#   LOCO=path         the loco binary (default build/loco)
set -euo pipefail
cd "$(dirname "$0")/.."
loco=${LOCO:-build/loco}
part=${PART:-utilisation}
out=runs/experiment-streaming-$part${TAG:+-$TAG}
rm -rf "$out"
mkdir -p "$out"

run() { # name, then --set arguments
    local name=$1
    shift
    echo "== $name: $*"
    "$loco" launch configs/multisite-4.ini --set run.dir="$out/$name" --set run.threads=1 \
        --set run.log_every=50 --set outer.optimizer=average --set compress.codec=int4 "$@" \
        >"$out/$name.log" 2>&1 || { tail -20 "$out/$name.log"; exit 1; }
}

if [[ $part == utilisation ]]; then
    steps=${STEPS:-192}
    common=(--set train.steps="$steps" --set run.eval_every=0 --set outer.H=24)
    for codec in int4 none; do
        run "blocking-$codec" "${common[@]}" --set compress.codec=$codec
        run "f2-$codec" "${common[@]}" --set compress.codec=$codec --set outer.fragments=2 \
            --set outer.overlap=2
        run "f4-$codec" "${common[@]}" --set compress.codec=$codec --set outer.fragments=4 \
            --set outer.overlap=2
    done
else
    steps=300
    common=(--set train.steps=$steps --set train.batch_size=64 --set train.warmup_steps=100
            --set run.eval_every=0 --set run.eval_batches=50 --set outer.H=24)
    run blocking "${common[@]}"
    for tau in ${TAUS:-1 2 3 4 5}; do
        run "f4-tau$tau" "${common[@]}" --set outer.fragments=4 --set outer.overlap="$tau" \
            --set outer.merge_alpha="${ALPHA:-0.5}"
    done
fi

python3 - "$out" "$part" "${DP_LOSS:-2.1376}" <<'PY'
import json, sys, glob, os
out, part, dp_loss = sys.argv[1], sys.argv[2], float(sys.argv[3])
runs = sorted(d for d in glob.glob(f"{out}/*") if os.path.isdir(d))
def records(run, site):
    return [json.loads(l) for l in open(f"{run}/{site}/outer.jsonl")]
def metrics(run, site):
    return [json.loads(l) for l in open(f"{run}/{site}/metrics.jsonl")]
sites = ["siteA", "siteB", "siteC", "siteD"]
lines = []
if part == "utilisation":
    lines += ["| run | outer steps | utilisation (mean of islands) | lowest island | wait per outer step | "
              "step time | bytes per sync per island | average rate | rate to hide it in the overlap |",
              "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        name = os.path.basename(run)
        util, waits, sync_bytes, total_bytes, wall = [], [], [], [], []
        for s in sites:
            r = records(run, s)
            w = sum(o["wait_s"] for o in r); t = sum(o["wall_s"] for o in r)
            util.append(1 - w / t)
            waits.append(w / len(r))
            sync_bytes.append(max(o["bytes_sent"] for o in r))
            total_bytes.append(sum(o["bytes_sent"] for o in r))
            wall.append(t)
        steps = max(o["step"] for o in records(run, "siteA"))
        step_s = sum(wall) / len(wall) / steps
        F = 4 if name.startswith("f4") else 2 if name.startswith("f2") else 1
        tau = 2 if F > 1 else 0
        peak = sum(sync_bytes) / len(sync_bytes) / (2 * step_s)  # within 2 inner steps
        avg = sum(total_bytes) / len(total_bytes) / (sum(wall) / len(wall))
        lines.append(f"| {name} (F={F}, overlap {tau}) | {len(records(run, 'siteA'))} | "
                     f"{100*sum(util)/len(util):.2f}% | {100*min(util):.2f}% | "
                     f"{1000*sum(waits)/len(waits):.0f} ms | {step_s:.3f} s | "
                     f"{sum(sync_bytes)/len(sync_bytes)/1e6:.2f} MB | {avg/1e6:.2f} MB/s | "
                     f"{peak/1e6:.2f} MB/s |")
else:
    lines += ["| run | final val loss (mean of islands) | vs data parallel | vs blocking | "
              "bytes per island | reduction vs data parallel |", "|---|---|---|---|---|---|"]
    base = None
    for run in runs:
        name = os.path.basename(run)
        vals = []
        for s in sites:
            v = [x["val_loss"] for x in metrics(run, s) if "val_loss" in x]
            vals.append(v[-1])
        loss = sum(vals) / len(vals)
        sent = sum(o["bytes_sent"] for o in records(run, "siteA"))
        raw32 = records(f"{out}/blocking", "siteA")[0]["bytes_raw"] / 3  # fp32 model bytes
        dp_sent = 300 * 2 * 3 / 4 * raw32
        if name == "blocking":
            base = loss
        lines.append(f"| {name} | {loss:.4f} | {100*(loss-dp_loss)/dp_loss:+.2f}% | "
                     f"{'' if base is None or name == 'blocking' else f'{100*(loss-base)/base:+.2f}%'} | "
                     f"{sent/1e6:.2f} MB | {dp_sent/sent:.0f}x |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
