#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan + UBSan, checksums
# computed but not enforced: FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) and
# runs each for SECONDS (default 60). `make fuzz` runs it at length; the test
# suite runs it briefly. Crashes are written to $BUILD/fuzz/ and fail the run.
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
arch=x86-64-v2
grep -q -m1 avx2 /proc/cpuinfo 2>/dev/null && arch=x86-64-v3
mkdir -p "$out"
# The library parts go into an archive, so the linker takes only the objects
# the targets need (core/ files with other dependencies stay out).
srcs="$(ls core/*.c) kernels/cpu/quant.c $(ls compress/*.c) $(ls net/*.c) $(ls faulttol/*.c) $(ls outer/*.c)"
flags="-std=c11 -D_GNU_SOURCE -g -O1 -march=$arch -fopenmp -I. -I/usr/include/x86_64-linux-gnu/openblas-pthread
       -fsanitize=address,undefined -fno-sanitize-recover=undefined
       -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION"
libs="-lopenblas -linih -lcjson -lxxhash -lzstd -lssl -lcrypto -lm -lpthread"
mkdir -p "$out/obj"
objs=""
for f in $srcs; do
  o="$out/obj/$(echo "${f%.c}" | tr / _).o"
  # shellcheck disable=SC2086
  "$cc" $flags -fsanitize=fuzzer-no-link -c "$f" -o "$o"
  objs="$objs $o"
done
rm -f "$out/libfuzzloco.a"
# shellcheck disable=SC2086
ar rcs "$out/libfuzzloco.a" $objs
for t in decode roundtrip frame state; do
  # shellcheck disable=SC2086
  "$cc" $flags -fsanitize=fuzzer -o "$out/fuzz_$t" "fuzz/fuzz_$t.c" "$out/libfuzzloco.a" $libs
done
for t in decode roundtrip frame state; do
  corpus="$out/corpus-$t"
  mkdir -p "$corpus"
  seeds=""
  [ -d "fuzz/corpus/$t" ] && seeds="fuzz/corpus/$t"
  echo "fuzz: fuzz_$t for ${secs}s"
  log="$out/fuzz_$t.log"
  status=0
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=2 "$out/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
    -max_len=16384 -print_final_stats=1 -artifact_prefix="$out/" "$corpus" $seeds \
    >"$log" 2>&1 || status=$?
  grep -E '^(stat::number_of_executed_units|stat::new_units_added|INFO: Seed)' "$log" || true
  if [ "$status" -ne 0 ]; then
    tail -n 40 "$log"
    echo "fuzz: FAILED (fuzz_$t exit $status), the input is in $out/ and the log in $log"
    exit 1
  fi
done
echo "fuzz: ok"
