#!/usr/bin/env bash
# Brief fuzz runs of every libFuzzer target (make fuzz runs them longer):
# 4 s each keeps the nine under 40 s once the clang library is built.
exec bash "$(dirname "$0")/../fuzz/run.sh" "${LOCO_FUZZ_SECONDS:-4}"
