#!/usr/bin/env bash
# Runs the CUDA twins' logic on this CPU, no GPU needed: kernels/cuda/*.cu
# translated to host C++ (translate.py, emu.h, fake_cublaslt.h), then
#   1. tests/gpu/test_cuda_kernels.c, test_cuda_tp.c, test_cuda_attention_block.c,
#      test_cuda_attention_tc.c, test_cuda_attention_gqa.c, test_cuda_moe.c, test_cuda_codecs.c and test_cuda_outer.c
#      (the outer loop's device mode against its host path), test_cuda_device.c
#      (device selection, on LOCO_EMU_DEVICES emulated devices) and test_cuda_sharded.c
#      (the ZeRO-3 device model against the whole one), test_cuda_pp.c (pipeline
#      stages of the device model against the whole one), test_cuda_llama_kernels.c
#      (RMSNorm, RoPE, SwiGLU), unchanged, against the
#      translated twins (the same assertions as on a GPU);
#   2. tests/gpu/test_cuda_model.c, the device model
#      (inner/model/gpt_cuda.c) against the CPU model, fp32 and bf16, and
#      trainer steps with train.device = cuda against cpu;
#   3. dp_check.c: train.device = cuda over 2 ranks (mpirun, mpi backend,
#      host-staged collectives), dp = 2 with ZeRO 0-3 (and ZeRO-3 in bf16) against one rank on
#      the same global batch (1e-5), a sharded checkpoint resumed; tp = 2 (the
#      device model's tp slice), tp = 2 with sp, cp = 2 (Ulysses and
#      ring) and pp = 2 (1F1B and zb-h1: device pipeline stages) likewise,
#      fp32 and bf16; GPT-2 (gpu_dp) and the Llama block (gpu_dp_llama);
#   4. scripts/gpu-dp-check.sh with the loco command linked over the twins
#      (gpu_cli): `loco train` runs of every dimension and their
#      compositions (four processes for dp x tp, dp x cp, tp x cp, dp x
#      pp, tp x pp, cp x pp, dp x ep, ep x tp), every pipeline schedule,
#      and the mixture of experts (ep, tp, cp, pp, routing biases) against
#      the one-rank run; then `loco bench memory`'s device table.
#
#   run.sh --ci      what `make test` runs: the CI column of the table below
#   run.sh --full    `make test-emu`: everything, full sizes, both thread orders
#   run.sh [criterion args]   everything at CI sizes
#   run.sh --filter PATTERN   a part, at CI sizes (--filter 'gpu_dp/*',
#                    'gpu_dp_llama/*' or 'gpu_cli/*': that multi-rank check only)
# It checks indexing, reductions, barriers, layouts and the codecs' bytes;
# not speed, not the real cuBLASLt (a reference of its documented
# semantics), not what only hardware shows (races the barriers hide,
# register spills, the fast-math of the real intrinsics). Needs
# $BUILD/libloco.a (make; BUILD=build by default) and g++ with C++20.
set -euo pipefail
cd "$(dirname "$0")/../../.."

# The one list of what CI (`make test`, --ci) runs and what it leaves to
# `make test-emu` (--full). Every Criterion test and both two-rank checks
# run in both; the full run adds sizes and an order:
#                      CI          full
#   Criterion tests    CI_FILTER   all
#   trainer steps      4           20 (as on a GPU; adds gpu_train's "loss fell" check)
#   dp_check steps     3           3 (see below)
#   dp_check archs     gpt2 llama  gpt2 llama
#   thread order       forward     forward, then reverse (LOCO_EMU_ORDER, emu.h)
#   gpu-dp-check runs  GPU_DP_SET=ci  all (its CI_LEAVES: what CI leaves)
CI_FILTER='*/*'
CI_TRAIN_STEPS=4 FULL_TRAIN_STEPS=20
# dp_check's fp32 parameter bound (1e-5 of max |param|) holds for about 4
# steps of its config: two ranks' rounding drifts through AdamW (8 steps:
# 1.8e-5 on the device, 1.4e-5 on the CPU path, 2026-12-05), so the full
# run keeps 3 steps.
CI_DP_STEPS=3 FULL_DP_STEPS=3
CI_ORDERS=forward FULL_ORDERS="forward reverse"
# gpu-dp-check.sh's runs: CI leaves those its CI_LEAVES lists (covered by
# another run or by dp_check); a part (--filter 'gpu_cli/*') runs all
CI_DP_SET=ci
DP_ARCHS="gpt2 llama"

mode=part
filter=""
args=()
for ((i = 1; i <= $#; i++)); do
  a=${!i}
  case "$a" in
    --ci) mode=ci ;;
    --full) mode=full ;;
    --filter) j=$((i + 1)); filter=${!j:-}; args+=("$a" "$filter"); i=$j ;;
    --filter=*) filter=${a#--filter=}; args+=("$a") ;;
    *) args+=("$a") ;;
  esac
done
if [ "$mode" = full ]; then
  train_steps=${EMU_TRAIN_STEPS:-$FULL_TRAIN_STEPS} dp_steps=${EMU_DP_STEPS:-$FULL_DP_STEPS}
  orders=$FULL_ORDERS dp_set=all
else
  train_steps=${EMU_TRAIN_STEPS:-$CI_TRAIN_STEPS} dp_steps=${EMU_DP_STEPS:-$CI_DP_STEPS}
  orders=$CI_ORDERS dp_set=all
  [ "$mode" = ci ] && dp_set=$CI_DP_SET
fi

# BUILD: the make build folder whose libloco.a to link (default build);
# the emulator's files go to $BUILD/emu (EMU_OUT to change).
build=${BUILD:-build}
out=${EMU_OUT:-$build/emu}
mkdir -p "$out"
[ -f "$build/libloco.a" ] || make -j2 BUILD="$build" "$build/libloco.a"
CXXFLAGS="-std=c++20 -O2 -I. -w"
CFLAGS="-std=c11 -D_GNU_SOURCE -DLOCO_HAVE_CUDA -I. -O2 -w"
LIBS="$build/libloco.a -lopenblas -linih -lcjson -lxxhash -lzstd -lcurl -lmicrohttpd -lpcre2-8 -lssl -lcrypto $(mpicc -showme:link 2>/dev/null) -lm -fopenmp -pthread"
# The trainer's communicator pulls in the nccl backend, which links the
# real CUDA and NCCL libraries (the twins themselves stay emulated).
CUDA_LIB=${CUDA_LIB:-/usr/local/cuda/lib64}
# NCCL where the Makefile found nccl.h (else the library has no nccl backend)
nccl=""
[ ! -e "$(dirname "$CUDA_LIB")/include/nccl.h" ] && [ ! -e /usr/include/nccl.h ] || nccl=-lnccl
LIBS="$LIBS -L$CUDA_LIB -Wl,-rpath,$CUDA_LIB $nccl -lcublasLt -lcudart -lstdc++"
python3 tests/gpu/emu/translate.py . "$out/twins.cpp"
g++ $CXXFLAGS -c "$out/twins.cpp" -o "$out/twins.o"
for t in test_cuda_kernels test_cuda_tp test_cuda_attention_block test_cuda_attention_tc \
  test_cuda_attention_gqa test_cuda_moe test_cuda_codecs test_cuda_outer test_cuda_device test_cuda_sharded \
  test_cuda_pp; do
  gcc $CFLAGS -c "tests/gpu/$t.c" -o "$out/$t.o"
done
# the Llama-family twins (gpu_llama/*)
gcc $CFLAGS -c tests/gpu/test_cuda_llama_kernels.c -o "$out/test_cuda_llama_kernels.o"
# the trainer comparison over $train_steps steps (20 on a GPU)
gcc $CFLAGS -DTRAIN_STEPS="$train_steps" -DTRAIN_TIMEOUT=600 \
  -c tests/gpu/test_cuda_model.c -o "$out/test_cuda_model.o"
g++ -o "$out/emu_tests" "$out/test_cuda_kernels.o" "$out/test_cuda_tp.o" \
  "$out/test_cuda_attention_block.o" "$out/test_cuda_attention_tc.o" "$out/test_cuda_attention_gqa.o" "$out/test_cuda_moe.o" "$out/test_cuda_codecs.o" \
  "$out/test_cuda_outer.o" "$out/test_cuda_device.o" "$out/test_cuda_sharded.o" "$out/test_cuda_pp.o" \
  "$out/test_cuda_model.o" "$out/twins.o" \
  "$out/test_cuda_llama_kernels.o" \
  $LIBS -lcriterion
gcc $CFLAGS -DSTEPS="$dp_steps" -c tests/gpu/emu/dp_check.c -o "$out/dp_check.o"
g++ -o "$out/dp_check" "$out/dp_check.o" "$out/twins.o" $LIBS
# the loco command itself over the twins: `loco train` with train.device =
# cuda on emulated devices (scripts/gpu-dp-check.sh runs it)
[ -f "$build/loco" ] || make -j2 BUILD="$build" "$build/loco"
g++ -o "$out/loco" $(ls "$build"/cli/*.o "$build"/bench/*.o) "$out/twins.o" $LIBS

# Counts for the closing line: Criterion tests run, two-rank checks run.
n_tests=0 n_dp=0 status=0
run_tests() { # ORDER criterion-args...
  local order=$1 log line n
  shift
  log=$(mktemp)
  echo "emulator: Criterion tests, thread order $order, $train_steps trainer steps"
  LOCO_EMU_ORDER=$order "$out/emu_tests" --jobs "${LOCO_TEST_JOBS:-2}" "$@" 2>&1 | tee "$log" ||
    status=1
  line=$(grep -a "Synthesis: Tested:" "$log" | tail -n 1 || true)
  n=$(sed -n 's/.*Tested: \([0-9]*\).*/\1/p' <<<"$line")
  n_tests=$((n_tests + ${n:-0}))
  rm -f "$log"
}
# gpu_dp/*: the two-rank device check (not a Criterion suite).
run_dp() { # ARCH ORDER
  command -v mpirun >/dev/null || { echo "gpu_dp: SKIPPED (no mpirun)"; return 0; }
  local d rc=0
  echo "emulator: dp_check, $1, thread order $2, $dp_steps steps"
  d=$(mktemp -d /tmp/loco-emu-dp-XXXXXX)
  LOCO_DP_ARCH=$1 LOCO_EMU_ORDER=$2 "$out/dp_check" ref "$d" || rc=$?
  [ "$rc" -ne 0 ] || LOCO_DP_ARCH=$1 LOCO_EMU_ORDER=$2 OMPI_MCA_orte_tmpdir_base="$d" \
    mpirun --allow-run-as-root --oversubscribe -np 2 "$out/dp_check" dp "$d" || rc=$?
  rm -rf "$d"
  n_dp=$((n_dp + 1))
  [ "$rc" -eq 0 ] || { echo "emulator: dp_check $1 ($2) FAILED"; status=1; }
}

# gpu_cli/*: scripts/gpu-dp-check.sh (the GPU machine's multi-rank step)
# with the emulated loco: `loco train` runs of every dimension and
# composition the script lists (its header), against one rank; not nccl
# (no NCCL device here). Then `loco bench memory`'s device table at tp = 2.
run_cli() { # ORDER
  command -v mpirun >/dev/null || { echo "gpu_cli: SKIPPED (no mpirun)"; return 0; }
  local rc=0
  echo "emulator: scripts/gpu-dp-check.sh over the emulated loco, thread order $1, $dp_steps steps"
  LOCO_EMU_ORDER=$1 LOCO_EMU_DEVICES=1 GPU_DP_NCCL=0 GPU_DP_STEPS=$dp_steps GPU_DP_SET=$dp_set \
    bash scripts/gpu-dp-check.sh "$out/loco" || rc=$?
  n_dp=$((n_dp + 1))
  [ "$rc" -eq 0 ] || { echo "emulator: gpu-dp-check ($1) FAILED"; status=1; }
  # the device model's activations per block, tp = 2 with and without sp,
  # fp32 and bf16, every recompute mode: the carve against its formula;
  # dense GPT-2, then Llama with an MoE block every second one (the
  # experts' buffers, the shared set of a mixed model under full)
  bench_rows dense
  bench_rows moe --set model.n_experts=4 --set model.top_k=2 --set model.moe_every=2 \
    --set model.arch=llama --set model.n_kv_head=2 --set model.ffn_hidden=96
}

# `loco bench memory`'s device table for a tiny tp = 2 model (KIND, then
# its extra keys): 12 rows, each at +0.00% of the formula.
bench_rows() {
  local kind=$1 log rows rc=0 table='/device model keeps/,/^full:/p'
  shift
  log=$(mktemp)
  LOCO_EMU_DEVICES=1 mpirun --allow-run-as-root --oversubscribe -np 2 "$out/loco" bench memory \
    configs/tiny.ini --set parallel.backend=mpi --set parallel.tp=2 --set model.n_layer=2 \
    --set model.n_embd=64 --set model.n_head=4 --set train.batch_size=2 "$@" >"$log" 2>&1 ||
    rc=$?
  sed -n "$table" "$log"
  rows=$(sed -n "$table" "$log" | grep -c '^| [fb][fp]*[0-9]* | .* | +0.00% |' || true)
  n_dp=$((n_dp + 1))
  if [ "$rc" -ne 0 ] || [ "$rows" -ne 12 ]; then
    echo "emulator: bench memory's device table ($kind): $rows of 12 rows at the formula (exit $rc)"
    tail -n 20 "$log"
    status=1
  fi
  rm -f "$log"
}

case "$mode:$filter" in
  part:gpu_cli*) run_cli forward; exit "$status" ;;
  part:gpu_dp_recompute*) LOCO_DP_RECOMPUTE=full run_dp llama forward; exit "$status" ;;
  part:gpu_dp_llama*) run_dp llama forward; exit "$status" ;;
  part:gpu_dp*) run_dp gpt2 forward; exit "$status" ;;
  part:?*) exec "$out/emu_tests" --jobs "${LOCO_TEST_JOBS:-2}" "${args[@]}" ;;
esac
for order in $orders; do
  if [ "$mode" = ci ]; then
    run_tests "$order" --filter "$CI_FILTER" "${args[@]}"
  else
    run_tests "$order" "${args[@]}"
  fi
  for arch in $DP_ARCHS; do
    run_dp "$arch" "$order"
  done
  # train.recompute = full on the device, every ZeRO stage, against the
  # reference that keeps everything
  LOCO_DP_RECOMPUTE=full run_dp llama "$order"
  run_cli "$order"
done
case "$mode" in
  full) left="the whole emulator suite (\`make test-emu\`)" ;;
  *) left="the rest is \`make test-emu\`: $FULL_TRAIN_STEPS trainer steps, the reverse thread order" ;;
esac
echo "emulator: $n_tests Criterion tests and $n_dp multi-rank checks ran, $([ "$status" -eq 0 ] && echo passed || echo FAILED); $left"
exit "$status"
