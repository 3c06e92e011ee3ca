#!/usr/bin/env bash
# The whole suite: every Criterion test (unit, model against PyTorch
# fixtures, training, CLI, mpirun runs), then brief fuzz runs. `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Passive OpenMP waiting: spinning threads fight OpenBLAS's pool for the
# cores (the loco binary sets the same for itself).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# OpenMPI refuses root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Criterion runs each test in its own process; two at a time on two cores.
status=0
build/tests/loco_tests --jobs "${LOCO_TEST_JOBS:-2}" 2>&1 | tee "$log" || status=$?
# Name the failures at the end, where CI logs are read.
grep -a "^\[FAIL\]" "$log" || true
if [ -x tests/fuzz.sh ]; then
  bash tests/fuzz.sh || status=$?
fi
# GPU tests skip where there is no device or no CUDA build: say so, and why.
gpu_skips=$(build/tests/loco_tests --filter 'gpu_*/*' --verbose 2>&1 | grep -a '^\[SKIP\] gpu_' | grep -av 'Test is disabled' || true)
if [ -n "$gpu_skips" ]; then
  echo "GPU tests: $(wc -l <<<"$gpu_skips") skipped: $(head -n 1 <<<"$gpu_skips" | sed 's/^\[SKIP\] [^ ]*: //')"
fi
# The export of a tensor-parallel checkpoint is loaded in PyTorch where it
# is installed (tests/fixtures/make_fixtures.py); say when it was not.
if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  echo "PyTorch check of tp export: skipped: python3-torch not installed (apt-get install python3-torch)"
fi
# One closing line with the counts, after everything.
line=$(grep -a "Synthesis: Tested:" "$log" | tail -n 1)
passed=$(sed -n 's/.*Passing: \([0-9]*\).*/\1/p' <<<"$line")
failing=$(sed -n 's/.*Failing: \([0-9]*\).*/\1/p' <<<"$line")
crashing=$(sed -n 's/.*Crashing: \([0-9]*\).*/\1/p' <<<"$line")
echo "tests: ${passed:-0} passed, $(( ${failing:-0} + ${crashing:-0} )) failed"
exit "$status"
