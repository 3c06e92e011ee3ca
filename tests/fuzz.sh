#!/usr/bin/env bash
# Brief fuzz runs of every libFuzzer target (make fuzz runs them longer):
# 4 s each keeps the nine under 40 s once the clang library is built.
# A fixed seed: the suite replays the same inputs on every run (new
# inputs are `make fuzz`'s job; what it finds joins fuzz/corpus/).
LOCO_FUZZ_SEED=${LOCO_FUZZ_SEED:-1} exec bash "$(dirname "$0")/../fuzz/run.sh" "${LOCO_FUZZ_SECONDS:-4}"
