#!/usr/bin/env bash
# Runs the CUDA twins' logic on this CPU, no GPU needed: kernels/cuda/*.cu
# translated to host C++ (translate.py, emu.h, fake_cublaslt.h), then
#   1. tests/gpu/test_cuda_kernels.c and test_cuda_codecs.c, unchanged,
#      against the translated twins (the same assertions as on a GPU);
#   2. check_model.c: a bf16 training step of bench/gpu/gpt2_gpu.c against
#      the CPU model.
# It checks indexing, reductions, barriers, layouts and the codecs' bytes;
# not speed, not the real cuBLASLt (a reference of its documented
# semantics), not what only hardware shows (races the barriers hide,
# register spills, the fast-math of the real intrinsics). Needs build/libloco.a
# (make) and g++ with C++20. Slow: every CUDA thread is a host thread.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=build/emu
mkdir -p "$out"
[ -f build/libloco.a ] || make -j2 build/libloco.a
CXXFLAGS="-std=c++20 -O2 -I. -w"
CFLAGS="-std=c11 -D_GNU_SOURCE -DLOCO_HAVE_CUDA -I. -O2 -w"
LIBS="build/libloco.a -lopenblas -linih -lcjson -lxxhash -lzstd -lcurl -lssl -lcrypto -lm -fopenmp -pthread"
python3 tests/gpu/emu/translate.py . "$out/twins.cpp"
g++ $CXXFLAGS -c "$out/twins.cpp" -o "$out/twins.o"
for t in test_cuda_kernels test_cuda_codecs; do
  gcc $CFLAGS -c "tests/gpu/$t.c" -o "$out/$t.o"
done
gcc $CFLAGS -c tests/gpu/emu/check_model.c -o "$out/check_model.o"
g++ -o "$out/emu_tests" "$out/test_cuda_kernels.o" "$out/test_cuda_codecs.o" "$out/twins.o" \
  $LIBS -lcriterion
g++ -o "$out/check_model" "$out/check_model.o" "$out/twins.o" $LIBS
status=0
"$out/check_model" || status=1
"$out/emu_tests" --jobs "${LOCO_TEST_JOBS:-2}" "$@" || status=1
exit $status
