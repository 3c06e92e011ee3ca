#!/usr/bin/env bash
# Prepares the default dataset: the King James Bible (public domain, from
# Debian's bible-kjv package) as byte-level train/val shards in data/.
set -euo pipefail
cd "$(dirname "$0")/.."
if ls data/kjv_train_*.bin >/dev/null 2>&1 && ls data/kjv_val_*.bin >/dev/null 2>&1; then
  exit 0
fi
mkdir -p data
command -v bible >/dev/null || { echo "prep-data: 'bible' not found; run scripts/install-deps.sh" >&2; exit 1; }
bible -f Gen1:1-Rev22:21 > data/kjv.txt.tmp
mv data/kjv.txt.tmp data/kjv.txt
build/loco prep data/kjv.txt data/kjv --val-frac 0.1 --shard-tokens 1048576
