#!/usr/bin/env bash
# configs/tiny-llama.ini's training step on this CPU: loco (`loco bench
# step --tiny-only`) and PyTorch eager of the same model
# (bench/pytorch_llama_cpu.py, Debian's python3-torch) in one run, with the
# same thread count, side by side. Usage: scripts/llama-cpu-bench.sh [THREADS]
# (default: every core). Prints a Markdown table for docs/PERFORMANCE.md.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
LOCO=${LOCO:-build/loco}
[ -x "$LOCO" ] || { echo "llama-cpu-bench: $LOCO not built (make)" >&2; exit 1; }
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "llama-cpu-bench: no PyTorch (apt-get install python3-torch)" >&2; exit 1; }
loco_out=$("$LOCO" bench step --tiny-only --threads "$threads")
echo "$loco_out" >&2
loco_row=$(grep '^| tiny-llama' <<<"$loco_out")
loco_tps=$(awk -F'|' '{gsub(/ /, "", $6); print $6}' <<<"$loco_row")
loco_ms=$(awk -F'|' '{gsub(/ /, "", $5); printf "%.1f", $5 * 1000}' <<<"$loco_row")
torch_json=$(/usr/bin/python3 bench/pytorch_llama_cpu.py --threads "$threads")
echo "$torch_json" >&2
read -r torch_ver torch_tps torch_ms < <(/usr/bin/python3 -c '
import json, sys
j = json.loads(sys.argv[1]); print(j["torch"], j["tok_per_s"], j["step_ms"])' "$torch_json")
echo "| implementation | threads | step ms | tokens/s | loco / PyTorch |"
echo "|---|---|---|---|---|"
echo "| loco (fp32, OpenBLAS) | $threads | $loco_ms | $loco_tps | $(awk -v a="$loco_tps" -v b="$torch_tps" 'BEGIN { printf "%.2fx", a / b }') |"
echo "| PyTorch $torch_ver eager | $threads | $torch_ms | $torch_tps | 1 |"
