#!/usr/bin/env bash
# The whole suite: every Criterion test (unit, model against PyTorch
# fixtures, training, CLI, mpirun runs), then brief fuzz runs and the
# kernel emulator's CI part (where nvcc is). `make test`.
# LOCO_TEST_FILTER (a Criterion --filter) runs those tests only, without
# the fuzz runs and the GPU summary; BUILD names the build directory.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
export LOCO_BIN=${LOCO_BIN:-$build/loco}
# Passive OpenMP waiting: spinning threads fight OpenBLAS's pool for the
# cores (the loco binary sets the same for itself).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# OpenMPI refuses root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# A process a test started can outlive it (Criterion's timeout kills the
# test's own process only) and would hold a pipe to this script open for
# ever. Every process the tests start inherits this mark in its
# environment, which finds them all: each test runs in a session of its
# own, so neither a session nor a process group would.
mark="$$-$RANDOM$RANDOM"
marked() {
  grep -lsxzF "LOCO_TEST_MARK=$mark" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 || true
}
kill_marked() {
  local pids
  pids=$(marked)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}

# Runs "$@" marked, stdout and stderr into the file $1 (also shown as it
# comes when $2 is 1: the file, not a pipe, so nothing left behind can hold
# the display open); returns its status. Then names and kills every marked
# process still there, counting them in left_behind.
left_behind=0
run_marked() {
  local out=$1 show=$2 pid shown='' rc=0 left p
  shift 2
  LOCO_TEST_MARK=$mark "$@" >"$out" 2>&1 &
  pid=$!
  if [ "$show" = 1 ]; then
    tail -n +1 -s 0.2 -f --pid="$pid" "$out" &
    shown=$!
  fi
  # `wait`, not a foreground command: a signal's trap runs at once
  wait "$pid" || rc=$?
  [ -z "$shown" ] || wait "$shown" || true
  left=$(marked)
  # a moment for processes on their way out
  [ -z "$left" ] || { sleep 1; left=$(marked); }
  for p in $left; do
    echo "left behind by the suite: $p $(ps -o args= -p "$p" || true)"
    left_behind=$((left_behind + 1))
  done
  [ -z "$left" ] || kill_marked
  return "$rc"
}

log=$(mktemp)
gpu_log=$(mktemp)
emu_log=$(mktemp)
trap 'kill_marked; rm -f "$log" "$gpu_log" "$emu_log"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
args=(--jobs "${LOCO_TEST_JOBS:-2}")
[ -z "${LOCO_TEST_FILTER:-}" ] || args+=(--filter "$LOCO_TEST_FILTER")
# Criterion runs each test in its own process; two at a time on two cores.
status=0
# Each step that fails is named here and again at the end.
failed_steps=()
step_failed() {
  failed_steps+=("$1 (status $2)")
  status=$2
}
rc=0
run_marked "$log" 1 "$build/tests/loco_tests" "${args[@]}" || rc=$?
[ "$rc" -eq 0 ] || step_failed "Criterion tests ($build/tests/loco_tests)" "$rc"
criterion_rc=$rc
if [ -z "${LOCO_TEST_FILTER:-}" ]; then
  if [ -x tests/fuzz.sh ]; then
    rc=0
    bash tests/fuzz.sh || rc=$?
    [ "$rc" -eq 0 ] || step_failed "fuzz runs (tests/fuzz.sh)" "$rc"
  fi
  # The kernel emulator's CI part (tests/gpu/emu/run.sh --ci): the CUDA
  # twins and the device model on this CPU. It links the CUDA build's
  # libloco.a and the toolkit's libraries, so it needs nvcc (NVCC from make;
  # found as the Makefile finds it when this script runs alone).
  nvcc=${NVCC-$(ls /usr/local/cuda/bin/nvcc 2>/dev/null || command -v nvcc || true)}
  if [ -n "$nvcc" ]; then
    export CUDA_LIB=${CUDA_LIB:-$(dirname "$(dirname "$nvcc")")/lib64}
    rc=0
    run_marked "$emu_log" 1 bash tests/gpu/emu/run.sh --ci || rc=$?
    [ "$rc" -eq 0 ] || step_failed "kernel emulator (tests/gpu/emu/run.sh --ci)" "$rc"
  else
    echo "emulator skipped: no nvcc (the CUDA twins and the device model are not checked)"
  fi
  # GPU tests skip where there is no device or no CUDA build: say so, and why.
  run_marked "$gpu_log" 0 "$build/tests/loco_tests" --filter 'gpu_*/*' --verbose || true
  gpu_skips=$(grep -a '^\[SKIP\] gpu_' "$gpu_log" | grep -av 'Test is disabled' || true)
  if [ -n "$gpu_skips" ]; then
    echo "GPU tests: $(wc -l <<<"$gpu_skips") skipped: $(head -n 1 <<<"$gpu_skips" | sed 's/^\[SKIP\] [^ ]*: //')"
  fi
  # The export of a tensor-parallel checkpoint is loaded in PyTorch where it
  # is installed (tests/fixtures/make_fixtures.py); say when it was not.
  if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
    echo "PyTorch check of tp export: skipped: python3-torch not installed (apt-get install python3-torch)"
  fi
fi
# The emulator's count again, beside the closing line.
grep -a '^emulator: .* ran' "$emu_log" || true
# One closing line with the counts, after everything.
line=$(grep -a "Synthesis: Tested:" "$log" | tail -n 1)
passed=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$line")
failing=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$line")
crashing=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$line")
if [ "$left_behind" -gt 0 ]; then
  echo "tests: ${passed:-0} passed, $(( ${failing:-0} + ${crashing:-0} )) failed; processes left behind: $left_behind"
  [ "$status" -ne 0 ] || status=1
else
  echo "tests: ${passed:-0} passed, $(( ${failing:-0} + ${crashing:-0} )) failed"
fi
# The failures at the very end, where CI logs are read (only the tail may
# be kept): each failed test, after its assertions ("[----] file:line:
# Assertion Failed" and the first lines of the message).
if grep -aq "^\[FAIL\]" "$log"; then
  echo "failed tests, with their assertions:"
  awk '/^\[----\] [^ ]*:[0-9]+: / { print; n = 5; next }
       /^\[----\]   / && n > 0 { if ($0 !~ /^\[----\]   *$/) { print; n-- }; next }
       /^\[FAIL\]/ { print; n = 0 }' "$log" | cut -c 1-300 || true
fi
# Criterion 2.4 also exits 1 when a test logged a warning (cr_log_warn) or
# an error, every test passing: name those lines.
if [ "$criterion_rc" -ne 0 ] && ! grep -aq "^\[FAIL\]" "$log"; then
  grep -a "^\[WARN\]\|^\[ERR\]" "$log" || true
fi
for s in "${failed_steps[@]}"; do
  echo "failed: $s"
done
exit "$status"
