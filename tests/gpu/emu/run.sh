#!/usr/bin/env bash
# Runs the CUDA twins' logic on this CPU, no GPU needed: kernels/cuda/*.cu
# translated to host C++ (translate.py, emu.h, fake_cublaslt.h), then
#   1. tests/gpu/test_cuda_kernels.c, test_cuda_tp.c, test_cuda_attention_block.c,
#      test_cuda_attention_tc.c, test_cuda_attention_gqa.c, test_cuda_moe.c, test_cuda_codecs.c and test_cuda_outer.c
#      (the outer loop's device mode against its host path), test_cuda_device.c
#      (device selection, on LOCO_EMU_DEVICES emulated devices) and test_cuda_sharded.c
#      (the ZeRO-3 device model against the whole one), test_cuda_llama_kernels.c
#      (RMSNorm, RoPE, SwiGLU), unchanged, against the
#      translated twins (the same assertions as on a GPU);
#   2. tests/gpu/test_cuda_model.c, the device model
#      (inner/model/gpt_cuda.c) against the CPU model, fp32 and bf16, and 20
#      trainer steps with train.device = cuda against cpu;
#   3. dp_check.c: train.device = cuda over 2 ranks (mpirun, mpi backend,
#      host-staged collectives), dp = 2 with ZeRO 0-3 (and ZeRO-3 in bf16) against one rank on
#      the same global batch (1e-5), a sharded checkpoint resumed.
#      `run.sh --filter 'gpu_dp/*'` runs only this part.
# It checks indexing, reductions, barriers, layouts and the codecs' bytes;
# not speed, not the real cuBLASLt (a reference of its documented
# semantics), not what only hardware shows (races the barriers hide,
# register spills, the fast-math of the real intrinsics). Needs
# $BUILD/libloco.a (make; BUILD=build by default) and g++ with C++20.
# Slow: every CUDA thread is a host thread.
set -euo pipefail
cd "$(dirname "$0")/../../.."
# BUILD: the make build folder whose libloco.a to link (default build);
# the emulator's files go to $BUILD/emu.
build=${BUILD:-build}
out=$build/emu
mkdir -p "$out"
[ -f "$build/libloco.a" ] || make -j2 BUILD="$build" "$build/libloco.a"
CXXFLAGS="-std=c++20 -O2 -I. -w"
CFLAGS="-std=c11 -D_GNU_SOURCE -DLOCO_HAVE_CUDA -I. -O2 -w"
LIBS="$build/libloco.a -lopenblas -linih -lcjson -lxxhash -lzstd -lcurl -lmicrohttpd -lpcre2-8 -lssl -lcrypto $(mpicc -showme:link 2>/dev/null) -lm -fopenmp -pthread"
# The trainer's communicator pulls in the nccl backend, which links the
# real CUDA and NCCL libraries (the twins themselves stay emulated).
CUDA_LIB=${CUDA_LIB:-/usr/local/cuda/lib64}
LIBS="$LIBS -L$CUDA_LIB -Wl,-rpath,$CUDA_LIB -lnccl -lcublasLt -lcudart -lstdc++"
python3 tests/gpu/emu/translate.py . "$out/twins.cpp"
g++ $CXXFLAGS -c "$out/twins.cpp" -o "$out/twins.o"
for t in test_cuda_kernels test_cuda_tp test_cuda_attention_block test_cuda_attention_tc \
  test_cuda_attention_gqa test_cuda_moe test_cuda_codecs test_cuda_outer test_cuda_device test_cuda_sharded; do
  gcc $CFLAGS -c "tests/gpu/$t.c" -o "$out/$t.o"
done
# the Llama-family twins (gpu_llama/*)
gcc $CFLAGS -c tests/gpu/test_cuda_llama_kernels.c -o "$out/test_cuda_llama_kernels.o"
# the trainer comparison over EMU_TRAIN_STEPS steps instead of 20
gcc $CFLAGS -DTRAIN_STEPS="${EMU_TRAIN_STEPS:-4}" -DTRAIN_TIMEOUT=3000 \
  -c tests/gpu/test_cuda_model.c -o "$out/test_cuda_model.o"
g++ -o "$out/emu_tests" "$out/test_cuda_kernels.o" "$out/test_cuda_tp.o" \
  "$out/test_cuda_attention_block.o" "$out/test_cuda_attention_tc.o" "$out/test_cuda_attention_gqa.o" "$out/test_cuda_moe.o" "$out/test_cuda_codecs.o" \
  "$out/test_cuda_outer.o" "$out/test_cuda_device.o" "$out/test_cuda_sharded.o" "$out/test_cuda_model.o" "$out/twins.o" \
  "$out/test_cuda_llama_kernels.o" \
  $LIBS -lcriterion
gcc $CFLAGS -DSTEPS="${EMU_DP_STEPS:-3}" -c tests/gpu/emu/dp_check.c -o "$out/dp_check.o"
g++ -o "$out/dp_check" "$out/dp_check.o" "$out/twins.o" $LIBS
# gpu_dp/*: the two-rank device check (not a Criterion suite).
filter=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --filter) filter=${args[i + 1]:-} ;;
    --filter=*) filter=${args[i]#--filter=} ;;
  esac
done
run_dp() {
  command -v mpirun >/dev/null || { echo "gpu_dp: SKIPPED (no mpirun)"; return 0; }
  local d
  d=$(mktemp -d /tmp/loco-emu-dp-XXXXXX)
  "$out/dp_check" ref "$d"
  OMPI_MCA_orte_tmpdir_base="$d" mpirun --allow-run-as-root --oversubscribe -np 2 \
    "$out/dp_check" dp "$d"
  rm -rf "$d"
}
case "$filter" in
  gpu_dp_llama*) LOCO_DP_ARCH=llama run_dp; exit ;;
  gpu_dp*) run_dp; exit ;;
  "") "$out/emu_tests" --jobs "${LOCO_TEST_JOBS:-2}" "$@"; run_dp; exit ;;
esac
exec "$out/emu_tests" --jobs "${LOCO_TEST_JOBS:-2}" "$@"
