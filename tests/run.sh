#!/usr/bin/env bash
# The whole suite: every Criterion test (unit, model against PyTorch
# fixtures, training, CLI), then the brief fuzz runs. Called by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Criterion runs each test in its own process; two at a time on two cores.
build/tests/loco_tests --jobs "${LOCO_TEST_JOBS:-2}"
if [ -x tests/fuzz.sh ]; then
  bash tests/fuzz.sh
fi
