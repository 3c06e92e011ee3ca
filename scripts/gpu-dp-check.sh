#!/usr/bin/env bash
# train.device = cuda over more than one rank on a machine with one GPU
# (docs/DECISIONS.md, "GPU data parallel"); the multi-rank step of
# scripts/gpu-check.sh. Runs a few steps of a tiny model on the same global
# batch (4 sequences of 32 tokens, data/kjv_train_*.bin) and compares every
# step's loss with the one-rank device run (backend self), 1e-5 relative:
#
#   nccl1    one rank, parallel.backend = nccl, ZeRO-1: the gradient
#            buckets, the owned AdamW and the all-gather on device pointers
#   dp2-zN   mpirun -np 2, both processes on the one GPU, backend mpi (the
#            collectives staged through pinned host buffers), dp = 2,
#            ZeRO 0, 1, 2 and 3 (ZeRO-3: the sharded device model, weights
#            gathered unit by unit)
#   tp2      mpirun -np 2 on the one GPU, backend mpi, tp = 2 (the device
#            model's tp slice, inner/model/gpt_cuda_tp.c; staged)
#   tp2-llama  the same on the Llama block with one key/value head of two
#            (replicated over the tp ranks), against its own one-rank run
#   dp2-tp2-llama-z3  that Llama block at dp = 2 x tp = 2, ZeRO-3
#   cp2      cp = 2, Ulysses (inner/model/gpt_cuda_cp.c: zig-zag chunks,
#            the heads' all-to-alls staged)
#   dp2-cp2-llama-z3  the Llama block at dp = 2 x cp = 2, ZeRO-3 (its one
#            key/value head replicated over the cp ranks)
#   tp2-cp2-sp  four heads at tp = 2 x cp = 2 with sp, against their own
#            one-rank run (ref-h4)
#   cp4-ring, cp4-ring-llama  cp = 4, ring attention: K|V blocks
#            and their gradients' accumulators three hops around the ring
#   tp2-sp   tp = 2 with sequence parallelism (norms and residuals on half
#            the rows each; all-gathers and reduce-scatters, staged)
#   dp2-tp2-sp-z3  mpirun -np 4 on the one GPU: dp = 2 x tp = 2 with sp,
#            ZeRO-3 (each tp slice sharded over dp, gathered unit by unit)
#   pp2, pp2-zb  pp = 2 (inner/model/gpt_cuda_pp.c: each process a device
#            pipeline stage of one block, activations and gradients between
#            them staged; the tied wte summed over the two stages), 1F1B
#            and zb-h1 (W apart from B), two micro-batches of 2
#   pp2-zb-recompute  zb-h1 with train.recompute = full
#   dp2-pp2-z2, dp2-pp2-z3  mpirun -np 4: dp = 2 x pp = 2, ZeRO-2 and
#            ZeRO-3 (each stage's gradients reduce-scattered after its
#            schedule; the stage keeps its whole parameters, as on the CPU)
#   tp2-pp2-sp, cp2-pp2-llama  pp = 2 with tp = 2 + sp, with cp = 2
#            (Ulysses, the Llama block)
#   pp2-interleaved, pp2-zbv, pp2-dualpipev  four blocks in four chunks,
#            two per process, four micro-batches of 1, against their own
#            one-rank run (ref-l4)
#   pp2-bf16 1F1B in bf16 against the one-rank bf16 run
#   moe-ep2, moe-tp2-sp, moe-pp2  a mixture of experts (4, top-2;
#            inner/model/gpt_cuda_moe.c) over ep = 2 (rows staged through
#            the host), tp = 2 + sp, pp = 2 (zb-h1), against its one-rank
#            run (ref-moe)
#   moe-cp2  cp = 2 (Ulysses) dropping at capacity 1.0: the capacity plan
#            of the cp group's whole sequences (against ref-moe-drop)
#   moe-dp4-ep2-z1, moe-dp4-ep2-z3  four processes, ep = 2 folded out of
#            dp = 4: the ep pre-reduction, then ZeRO-1 buckets or ZeRO-3
#            units over the expert-dp group (against ref-moe-m1)
#   moe-bias one rank with DeepSeek-V3's routing biases against the CPU
#            path's run (ref-moe-bias-cpu): the device's routing counts
#            move the host's biases, which go back to the device
#   mixtral-ep2-tp2  mpirun -np 4: Mixtral's kind (SwiGLU experts, a
#            shared expert, dropping at capacity 1.25) in bf16 over ep = 2 x
#            tp = 2, against its one-rank bf16 run, 1e-3 (tp's rounding)
#   tp2-bf16 tp = 2 in bf16 against the one-rank bf16 run, 1e-3 relative:
#            bf16 tp rounds each rank's share of a sum before adding it,
#            one rank the sum (the emulator's dp_check measures the gap;
#            one rank's bf16 is 3e-4 from its fp32 in loss)
#
# Each run's line (JSON) has its worst loss difference and its tokens/s
# (the mean of the steps after the first; these runs share one GPU and
# stage through the host: a check, not a speed).
#
# usage: scripts/gpu-dp-check.sh LOCO_BINARY   (a build with CUDA and MPI)
# GPU_DP_SET=ci: the runs `make test` needs (each dimension, schedule
# family and composition once; CI_LEAVES below lists what it leaves to
# `make test-emu` and the GPU, where every run goes: the emulator's
# dp_check covers those cases too). GPU_DP_STEPS (default 6) steps;
# GPU_DP_NCCL=0 leaves out nccl1 (the
# kernel emulator's loco, tests/gpu/emu/run.sh, runs the rest on a CPU).
# Exit status 0 when every run matched; 1 otherwise; 2 for a usage error.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
LOCO=${1:?usage: scripts/gpu-dp-check.sh LOCO_BINARY}
STEPS=${GPU_DP_STEPS:-6}
d=$(mktemp -d /tmp/loco-gpu-dp-XXXXXX)
trap 'rm -rf "$d"' EXIT
export OMPI_MCA_orte_tmpdir_base=$d OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TINY=(--set model.n_layer=2 --set model.n_head=2 --set model.n_embd=32 --set model.seq_len=32
      --set train.steps="$STEPS" --set train.warmup_steps=2 --set train.grad_clip=0.5
      --set train.device=cuda --set run.threads=1 --set run.eval_every=0 --set run.log_every=1
      --set run.ckpt_every=0 --set parallel.bucket_mb=0.004)
fail=0
# Runs a CI run leaves (GPU_DP_SET=ci): a second ZeRO stage of a kind
# covered, a family covered by a composition, bf16 and recompute where
# dp_check's p and z cases (gpu_dp, gpu_dp_recompute) hold them.
CI_LEAVES=(dp2-z1 dp2-z2 tp2-llama dp2-tp2-llama-z3 cp4-ring-llama tp2-bf16 pp2
           pp2-zb-recompute dp2-pp2-z2 pp2-zbv pp2-bf16 moe-ep2 moe-dp4-ep2-z1)
left() {
  [ "${GPU_DP_SET:-}" = ci ] || return 1
  local n
  for n in "${CI_LEAVES[@]}"; do [ "$n" = "$1" ] && return 0; done
  return 1
}
run() { # name, then the command; its output in $d/name.log
  local name=$1
  shift
  if left "$name"; then
    echo "gpu-dp: $name: left to make test-emu (GPU_DP_SET=ci)"
    return 0
  fi
  if "$@" >"$d/$name.log" 2>&1; then
    echo "gpu-dp: $name: ran"
  else
    echo "gpu-dp: $name: FAILED (exit $?); its log ends:"
    tail -n 15 "$d/$name.log"
    fail=1
  fi
}
# the losses of two runs' metrics.jsonl, step by step (REF: the one-rank
# run, ref by default; TOL relative, 1e-5 by default)
compare() {
  left "$1" && return 0
  python3 - "$d/${2:-ref}/metrics.jsonl" "$d/$1/metrics.jsonl" "$1" "$STEPS" "${3:-1e-5}" <<'PY'
import json, sys
ref_path, got_path, name, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
tol = float(sys.argv[5])
tps = []
def losses(path, speed=None):
    out = {}
    try:
        for line in open(path):
            r = json.loads(line)
            if "loss" in r and "step" in r:
                out[r["step"]] = r["loss"]
                if speed is not None and r["step"] > 1 and "tokens_per_s" in r:
                    speed.append(r["tokens_per_s"])
    except OSError as e:
        print(f"gpu-dp: {name}: no metrics ({e})")
    return out
ref, got = losses(ref_path), losses(got_path, tps)
worst, bad = 0.0, []
for s in range(1, steps + 1):
    if s not in ref or s not in got:
        bad.append(f"step {s} missing")
        continue
    e = abs(got[s] - ref[s]) / abs(ref[s])
    worst = max(worst, e)
    if e > tol:
        bad.append(f"step {s}: {got[s]:.9g} vs one rank {ref[s]:.9g}")
print(json.dumps({"run": name, "steps": steps, "worst_rel_diff": worst, "tol": tol,
                  "ok": not bad,
                  "tokens_per_s": sum(tps) / len(tps) if tps else None}))
for b in bad:
    print(f"gpu-dp: {name}: {b}")
sys.exit(1 if bad else 0)
PY
}
run ref "$LOCO" train configs/tiny.ini "${TINY[@]}" --set parallel.backend=self \
  --set train.batch_size=4 --set run.dir="$d/ref"
[ $fail -eq 0 ] || exit 1
if [ "${GPU_DP_NCCL:-1}" = 1 ]; then
  run nccl1 "$LOCO" train configs/tiny.ini "${TINY[@]}" --set parallel.backend=nccl \
    --set parallel.zero_stage=1 --set train.batch_size=4 --set run.dir="$d/nccl1"
  compare nccl1 || fail=1
else
  echo "gpu-dp: nccl1: skipped (GPU_DP_NCCL=0: the emulator has no NCCL device)"
fi
for z in 0 1 2 3; do
  run "dp2-z$z" mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
    --set parallel.backend=mpi --set parallel.dp=2 --set parallel.zero_stage="$z" \
    --set train.batch_size=2 --set run.dir="$d/dp2-z$z"
  compare "dp2-z$z" || fail=1
done
run tp2 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  --set parallel.backend=mpi --set parallel.tp=2 --set train.batch_size=4 --set run.dir="$d/tp2"
compare tp2 || fail=1
run tp2-sp mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  --set parallel.backend=mpi --set parallel.tp=2 --set parallel.sp=true \
  --set train.batch_size=4 --set run.dir="$d/tp2-sp"
compare tp2-sp || fail=1
run dp2-tp2-sp-z3 mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  --set parallel.backend=mpi --set parallel.dp=2 --set parallel.tp=2 --set parallel.sp=true \
  --set parallel.zero_stage=3 --set train.batch_size=2 --set run.dir="$d/dp2-tp2-sp-z3"
compare dp2-tp2-sp-z3 || fail=1
LLAMA=(--set model.arch=llama --set model.n_kv_head=1 --set model.ffn_hidden=48)
run ref-llama "$LOCO" train configs/tiny.ini "${TINY[@]}" "${LLAMA[@]}" \
  --set parallel.backend=self --set train.batch_size=4 --set run.dir="$d/ref-llama"
run tp2-llama mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${LLAMA[@]}" --set parallel.backend=mpi --set parallel.tp=2 --set train.batch_size=4 \
  --set run.dir="$d/tp2-llama"
compare tp2-llama ref-llama || fail=1
run dp2-tp2-llama-z3 mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${LLAMA[@]}" --set parallel.backend=mpi --set parallel.dp=2 --set parallel.tp=2 \
  --set parallel.zero_stage=3 --set train.batch_size=2 --set run.dir="$d/dp2-tp2-llama-z3"
compare dp2-tp2-llama-z3 ref-llama || fail=1
ULY=(--set parallel.cp=2 --set parallel.cp_algo=ulysses)
run cp2 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${ULY[@]}" \
  --set parallel.backend=mpi --set train.batch_size=4 --set run.dir="$d/cp2"
compare cp2 || fail=1
run dp2-cp2-llama-z3 mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${LLAMA[@]}" "${ULY[@]}" --set parallel.backend=mpi --set parallel.dp=2 \
  --set parallel.zero_stage=3 --set train.batch_size=2 --set run.dir="$d/dp2-cp2-llama-z3"
compare dp2-cp2-llama-z3 ref-llama || fail=1
H4=(--set model.n_head=4)
run ref-h4 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${H4[@]}" --set parallel.backend=self \
  --set train.batch_size=4 --set run.dir="$d/ref-h4"
run tp2-cp2-sp mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${H4[@]}" "${ULY[@]}" --set parallel.backend=mpi --set parallel.tp=2 --set parallel.sp=true \
  --set train.batch_size=4 --set run.dir="$d/tp2-cp2-sp"
compare tp2-cp2-sp ref-h4 || fail=1
RING=(--set parallel.cp=4 --set parallel.cp_algo=ring)
run cp4-ring mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${RING[@]}" --set parallel.backend=mpi --set train.batch_size=4 --set run.dir="$d/cp4-ring"
compare cp4-ring || fail=1
run cp4-ring-llama mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${LLAMA[@]}" "${RING[@]}" --set parallel.backend=mpi --set train.batch_size=4 \
  --set run.dir="$d/cp4-ring-llama"
compare cp4-ring-llama ref-llama || fail=1
BF16=(--set train.dtype=bf16)
run ref-bf16 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${BF16[@]}" \
  --set parallel.backend=self --set train.batch_size=4 --set run.dir="$d/ref-bf16"
run tp2-bf16 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${BF16[@]}" --set parallel.backend=mpi --set parallel.tp=2 --set train.batch_size=4 \
  --set run.dir="$d/tp2-bf16"
compare tp2-bf16 ref-bf16 1e-3 || fail=1
# pipeline stages: the same global batch as micro-batches (batch_size x
# grad_accum sequences, read in the order one rank reads its 4)
PP=(--set parallel.backend=mpi --set parallel.pp=2)
M2=(--set train.batch_size=2 --set train.grad_accum=2)
run pp2 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${PP[@]}" \
  "${M2[@]}" --set run.dir="$d/pp2"
compare pp2 || fail=1
run pp2-zb mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${PP[@]}" \
  "${M2[@]}" --set parallel.pp_schedule=zb-h1 --set run.dir="$d/pp2-zb"
compare pp2-zb || fail=1
run pp2-zb-recompute mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${PP[@]}" "${M2[@]}" --set parallel.pp_schedule=zb-h1 --set train.recompute=full \
  --set run.dir="$d/pp2-zb-recompute"
compare pp2-zb-recompute || fail=1
run dp2-pp2-z2 mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${PP[@]}" --set parallel.dp=2 --set parallel.zero_stage=2 --set train.batch_size=1 \
  --set train.grad_accum=2 --set run.dir="$d/dp2-pp2-z2"
compare dp2-pp2-z2 || fail=1
run dp2-pp2-z3 mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${PP[@]}" --set parallel.dp=2 --set parallel.zero_stage=3 --set train.batch_size=1 \
  --set train.grad_accum=2 --set run.dir="$d/dp2-pp2-z3"
compare dp2-pp2-z3 || fail=1
run tp2-pp2-sp mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${PP[@]}" "${M2[@]}" --set parallel.tp=2 --set parallel.sp=true --set run.dir="$d/tp2-pp2-sp"
compare tp2-pp2-sp || fail=1
run cp2-pp2-llama mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${LLAMA[@]}" "${ULY[@]}" "${PP[@]}" "${M2[@]}" --set run.dir="$d/cp2-pp2-llama"
compare cp2-pp2-llama ref-llama || fail=1
L4=(--set model.n_layer=4)
run ref-l4 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${L4[@]}" --set parallel.backend=self \
  --set train.batch_size=4 --set run.dir="$d/ref-l4"
for sched in interleaved zbv dualpipev; do
  run "pp2-$sched" mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
    "${L4[@]}" "${PP[@]}" --set parallel.pp_schedule="$sched" --set parallel.virtual_stages=2 \
    --set train.batch_size=1 --set train.grad_accum=4 --set run.dir="$d/pp2-$sched"
  compare "pp2-$sched" ref-l4 || fail=1
done
run pp2-bf16 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${BF16[@]}" "${PP[@]}" "${M2[@]}" --set run.dir="$d/pp2-bf16"
compare pp2-bf16 ref-bf16 || fail=1
# mixture of experts (inner/model/gpt_cuda_moe.c): four experts, top-2, in
# micro-batches of 2 (the capacity plan's group), against one rank
MOE=(--set model.n_experts=4 --set model.top_k=2 --set train.batch_size=2)
run ref-moe "$LOCO" train configs/tiny.ini "${TINY[@]}" "${MOE[@]}" --set parallel.backend=self \
  --set train.grad_accum=2 --set run.dir="$d/ref-moe"
run ref-moe-drop "$LOCO" train configs/tiny.ini "${TINY[@]}" "${MOE[@]}" \
  --set parallel.backend=self --set model.capacity_factor=1.0 --set train.grad_accum=2 \
  --set run.dir="$d/ref-moe-drop"
run moe-ep2 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${MOE[@]}" --set parallel.backend=mpi --set parallel.dp=2 --set parallel.ep=2 \
  --set run.dir="$d/moe-ep2"
compare moe-ep2 ref-moe || fail=1
# dp = 4 folds ep = 2 out of it: the expert-dp group of 2 reduces (ZeRO-1
# in buckets, ZeRO-3 unit by unit) after the ep pre-reduction
run ref-moe-m1 "$LOCO" train configs/tiny.ini "${TINY[@]}" "${MOE[@]}" \
  --set parallel.backend=self --set train.batch_size=1 --set train.grad_accum=4 \
  --set run.dir="$d/ref-moe-m1"
for z in 1 3; do
  run "moe-dp4-ep2-z$z" mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini \
    "${TINY[@]}" "${MOE[@]}" --set parallel.backend=mpi --set parallel.dp=4 --set parallel.ep=2 \
    --set parallel.zero_stage="$z" --set train.batch_size=1 --set run.dir="$d/moe-dp4-ep2-z$z"
  compare "moe-dp4-ep2-z$z" ref-moe-m1 || fail=1
done
run moe-tp2-sp mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${MOE[@]}" --set parallel.backend=mpi --set parallel.tp=2 --set parallel.sp=true \
  --set train.grad_accum=2 --set run.dir="$d/moe-tp2-sp"
compare moe-tp2-sp ref-moe || fail=1
run moe-cp2 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${MOE[@]}" "${ULY[@]}" --set parallel.backend=mpi --set model.capacity_factor=1.0 \
  --set train.grad_accum=2 --set run.dir="$d/moe-cp2"
compare moe-cp2 ref-moe-drop || fail=1
run moe-pp2 mpirun --oversubscribe -np 2 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${MOE[@]}" --set parallel.backend=mpi --set parallel.pp=2 --set parallel.pp_schedule=zb-h1 \
  --set train.grad_accum=2 --set run.dir="$d/moe-pp2"
compare moe-pp2 ref-moe || fail=1
# DeepSeek-V3's routing biases, moved after every step from what the
# device routed (dropping at capacity 1.0), against the CPU path's run
BIAS=(--set model.router_bias_rate=0.01 --set model.capacity_factor=1.0 --set train.grad_accum=2)
run ref-moe-bias-cpu "$LOCO" train configs/tiny.ini "${TINY[@]}" "${MOE[@]}" "${BIAS[@]}" \
  --set train.device=cpu --set run.dir="$d/ref-moe-bias-cpu"
run moe-bias "$LOCO" train configs/tiny.ini "${TINY[@]}" "${MOE[@]}" "${BIAS[@]}" \
  --set parallel.backend=self --set run.dir="$d/moe-bias"
compare moe-bias ref-moe-bias-cpu || fail=1
# Mixtral's kind: the Llama block's experts (SwiGLU), a shared expert,
# dropping at capacity 1.25, in bf16, experts over ep = 2 with tp = 2
MIX=(--set model.arch=llama --set model.n_kv_head=1 --set model.ffn_hidden=48
     --set model.n_shared_experts=1 --set model.capacity_factor=1.25 --set train.dtype=bf16)
run ref-mixtral "$LOCO" train configs/tiny.ini "${TINY[@]}" "${MOE[@]}" "${MIX[@]}" \
  --set parallel.backend=self --set train.grad_accum=2 --set run.dir="$d/ref-mixtral"
run mixtral-ep2-tp2 mpirun --oversubscribe -np 4 "$LOCO" train configs/tiny.ini "${TINY[@]}" \
  "${MOE[@]}" "${MIX[@]}" --set parallel.backend=mpi --set parallel.dp=2 --set parallel.ep=2 \
  --set parallel.tp=2 --set run.dir="$d/mixtral-ep2-tp2"
compare mixtral-ep2-tp2 ref-mixtral 1e-3 || fail=1
exit $fail
