#!/usr/bin/env bash
# The BPE variant of the default dataset (configs/tiny-bpe.ini): a 1024-id
# byte-level BPE trained on the training part of data/kjv.txt (the first
# 90%, as `loco prep --val-frac 0.1` splits it), then BPE train/val shards
# of the whole text and the tokenizer beside them.
set -euo pipefail
cd "$(dirname "$0")/.."
LOCO=${LOCO:-build/loco}
if ls data/kjv_bpe_train_*.bin >/dev/null 2>&1 && ls data/kjv_bpe_val_*.bin >/dev/null 2>&1 &&
   [ -f data/kjv_bpe_tokenizer.json ]; then
  exit 0
fi
[ -f data/kjv.txt ] || bash scripts/prep-data.sh
size=$(stat -c %s data/kjv.txt)
head -c $((size * 9 / 10)) data/kjv.txt > data/kjv_bpe_train.txt.tmp
mv data/kjv_bpe_train.txt.tmp data/kjv_bpe_train.txt
"$LOCO" tokenizer train data/kjv_bpe_train.txt --vocab 1024 --out data/kjv-bpe1k.json
"$LOCO" prep data/kjv.txt data/kjv_bpe --tokenizer data/kjv-bpe1k.json --val-frac 0.1 \
  --shard-tokens 1048576
