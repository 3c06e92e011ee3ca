#!/usr/bin/env bash
# Brief fuzz runs of every libFuzzer target (make fuzz runs them longer).
exec bash "$(dirname "$0")/../fuzz/run.sh" "${LOCO_FUZZ_SECONDS:-5}"
