#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (every fuzz/fuzz_*.c) with clang
# (ASan + UBSan, checksums computed but not enforced:
# FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) and runs each for SECONDS
# (default 60). `make fuzz` runs it at length; the test suite runs it
# briefly. Crashes are written to $BUILD/fuzz/ and fail the run.
# LOCO_FUZZ_SEED fixes libFuzzer's seed (the suite's brief run uses 1, so
# a fresh clone replays the same inputs and CI does not fail by chance);
# unset or 0, libFuzzer draws one, which `make fuzz` wants for exploring.
# Usage: fuzz/run.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
out=${BUILD:-build}/fuzz
cc=${FUZZ_CC:-clang}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "fuzz: SKIPPED, $cc not found (scripts/install-deps.sh installs clang and libclang-rt-14-dev)"
  exit 0
fi
mkdir -p "$out"
# The library is the Makefile's own (its source list, its flags, -MMD
# dependencies: rebuilt only where something changed), built with clang
# into $out/lib without CUDA (NVCC=): the CUDA twins are not host code.
# CFLAGS from the environment, not the command line: the Makefile appends
# its flags to them. -O1 keeps ASan's reports readable and the build short.
# -Wno-pass-failed: at -O1 clang reports the `omp simd` loops it did not
# vectorise (an optimiser note, which -Werror would make fatal).
san="-Wno-pass-failed -fsanitize=address,undefined -fno-sanitize-recover=undefined -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION"
CFLAGS="$san -fsanitize=fuzzer-no-link" make -s -j"${FUZZ_JOBS:-2}" NVCC= CC="$cc" OPT=-O1 \
  BUILD="$out/lib" "$out/lib/libloco.a"
libs=$(make -s NVCC= print-ldlibs)
flags="-std=c11 -D_GNU_SOURCE -g -O1 -fopenmp -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread $san"
targets=""
for src in fuzz/fuzz_*.c; do
  t=$(basename "$src" .c)
  targets="$targets $t"
  if [ ! -x "$out/$t" ] || [ -n "$(find "$src" fuzz/fuzz.h "$out/lib/libloco.a" -newer "$out/$t" 2>/dev/null)" ]; then
    # shellcheck disable=SC2086
    "$cc" $flags -fsanitize=fuzzer -o "$out/$t" "$src" "$out/lib/libloco.a" $libs
  fi
done
for t in $targets; do
  name=${t#fuzz_}
  corpus="$out/corpus-$name"
  mkdir -p "$corpus"
  seeds=""
  [ -d "fuzz/corpus/$name" ] && seeds="fuzz/corpus/$name"
  echo "fuzz: $t for ${secs}s"
  log="$out/$t.log"
  status=0
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=2 "$out/$t" -max_total_time="$secs" -seed="${LOCO_FUZZ_SEED:-0}" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$out/" "$corpus" $seeds \
    >"$log" 2>&1 || status=$?
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|INFO: Seed)' "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log"
    echo "fuzz: FAILED ($t exit $status), the input is in $out/ and the log in $log"
    exit 1
  fi
done
echo "fuzz: ok"
