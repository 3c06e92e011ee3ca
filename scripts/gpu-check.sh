#!/usr/bin/env bash
# The GPU checks of loco in one call, for a machine with one NVIDIA GPU
# (written for an H200: CUDA, PyTorch and Python, but none of Debian's -dev
# packages and no network). It runs every GPU test (tests/gpu: each CUDA
# kernel against its CPU twin, the GPU codecs byte for byte, the nccl
# backend on one rank, the whole model's loss and gradients against the
# CPU model, 20 trainer steps with train.device = cuda against cpu), then benchmarks GPT-2 124M training (B=16, T=1024,
# bf16) with loco's CUDA kernels (build/loco-gpu-bench) beside the same model
# in PyTorch, eager and torch.compile (bench/pytorch_gpt2.py), and prints a
# table last. Budget: under 8 minutes.
#
#   scripts/gpu-check.sh --bundle   on a build machine with the -dev packages
#       (scripts/install-deps.sh) and nvcc: builds the GPU test and bench
#       binaries (without MPI) and packs them with the shared libraries the
#       GPU machine lacks into build-gpu/bundle.tar.xz (about 15 MB).
#   scripts/gpu-check.sh            on the GPU machine: uses that bundle when
#       it is there, else builds with make (which needs the -dev packages).
#
# Logs and a results.json go to $OUT when set, else build-gpu/out.
# Exit status: 0 when every GPU test passed and no benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
BUNDLE=build-gpu/bundle.tar.xz
JOBS=$(nproc 2>/dev/null || echo 4)

if [ "${1:-}" = "--bundle" ]; then
  set -e
  make -j"$JOBS" BUILD=build-gpu MPI_CFLAGS= MPI_LIBS= build-gpu/tests/test_gpu \
    build-gpu/loco-gpu-bench
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  cp build-gpu/tests/test_gpu build-gpu/loco-gpu-bench "$stage/bin/"
  # every library the binaries load except the C runtime and the big CUDA
  # libraries (cuBLASLt, NCCL), which the GPU machine has
  for lib in $(ldd build-gpu/tests/test_gpu build-gpu/loco-gpu-bench |
               awk '$3 ~ /^\// {print $3}' | sort -u); do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|ld-linux*|libresolv.so*) ;;
      libstdc++.so*|libgcc_s.so*) ;; # newer ones there serve older binaries
      libcuda.so*|libcublas*|libnccl*) ;;
      *) cp -L "$lib" "$stage/lib/" ;;
    esac
  done
  tar -C "$stage" -cJf "$BUNDLE" .
  echo "gpu-check: wrote $BUNDLE ($(du -h "$BUNDLE" | cut -f1)); carry it to the GPU machine"
  exit 0
fi

LOG=${OUT:-build-gpu/out}
mkdir -p "$LOG"
status=0
t_start=$(date +%s)
say() { echo "gpu-check [$(( $(date +%s) - t_start ))s]: $*"; }

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "no nvidia-smi"; } | tee "$LOG/device.txt"

# CUDA libraries: the toolkit's, then the ones PyTorch's wheels bring.
CUDA_LIBS=/usr/local/cuda/lib64
for m in nccl cublas cuda_runtime; do
  d=$(python3 -c "import importlib, os; p = importlib.import_module('nvidia.$m'); \
print(os.path.join(list(p.__path__)[0], 'lib'))" 2>/dev/null) && CUDA_LIBS="$CUDA_LIBS:$d"
done

if [ -f "$BUNDLE" ]; then
  say "using $BUNDLE"
  dir=$(mktemp -d)
  tar -C "$dir" -xJf "$BUNDLE"
  TESTBIN=$dir/bin/test_gpu
  BENCHBIN=$dir/bin/loco-gpu-bench
  LOCO_LD="$dir/lib:$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
else
  say "building (make -j$JOBS)"
  if ! make -j"$JOBS" build/tests/test_gpu cuda >"$LOG/build.log" 2>&1; then
    tail -n 30 "$LOG/build.log"
    echo "gpu-check: the build failed (this machine may lack Debian's -dev packages:" \
         "run 'scripts/gpu-check.sh --bundle' on a build machine and carry $BUNDLE)" >&2
    exit 1
  fi
  TESTBIN=build/tests/test_gpu
  BENCHBIN=build/loco-gpu-bench
  LOCO_LD="$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
fi

say "GPU tests"
# the bundle's libraries for loco's binaries alone (never for python3)
timeout 240 env LD_LIBRARY_PATH="$LOCO_LD" "$TESTBIN" --verbose --jobs 4 >"$LOG/tests.log" 2>&1
trc=$?
grep -a -E "^\[(FAIL|SKIP)|Synthesis" "$LOG/tests.log"
grep -a -q "^\[SKIP" "$LOG/tests.log" && { echo "gpu-check: a GPU test skipped on a GPU machine"; status=1; }
[ $trc -eq 0 ] || status=1

run_bench() { # name, seconds, command...
  local name=$1 secs=$2
  shift 2
  say "benchmark $name"
  timeout "$secs" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then
    tail -n 3 "$LOG/$name.log"
  else
    echo "gpu-check: $name failed (exit $rc; 124 = timed out):"
    tail -n 15 "$LOG/$name.log"
    status=1
  fi
}
run_bench loco 150 env LD_LIBRARY_PATH="$LOCO_LD" "$BENCHBIN" --batch 16 --seq 1024 --steps 20 --warmup 3 \
  --profile 3
export PYTHONUNBUFFERED=1
run_bench pytorch-eager 120 python3 bench/pytorch_gpt2.py --mode eager --steps 20 --warmup 3
run_bench pytorch-compile 240 python3 bench/pytorch_gpt2.py --mode compile --steps 20 --warmup 3

say "summary"
python3 - "$LOG" <<'PY'
import json, os, sys
log = sys.argv[1]
rows = []
for name in ("loco", "pytorch-eager", "pytorch-compile"):
    try:
        lines = open(os.path.join(log, name + ".log")).read().splitlines()
        rows.append(json.loads([l for l in lines if l.startswith("{")][-1]))
    except (OSError, IndexError, ValueError):
        rows.append({"impl": name})
json.dump(rows, open(os.path.join(log, "results.json"), "w"), indent=1)
dev = open(os.path.join(log, "device.txt")).read().strip()
print(f"GPT-2 124M training, B=16 T=1024, bf16, on {dev}")
print(f"{'implementation':<18}{'step ms':>10}{'tokens/s':>12}{'MFU':>8}{'loss first -> last':>22}")
for r in rows:
    if "tok_per_s" not in r:
        print(f"{r['impl']:<18}{'failed':>10}")
        continue
    print(f"{r['impl']:<18}{r['step_ms']:>10.1f}{r['tok_per_s']:>12.0f}{100 * r['mfu']:>7.1f}%"
          f"{r['loss_first']:>12.3f} -> {r['loss_last']:.3f}")
try:
    prof = [l for l in open(os.path.join(log, "loco.log")) if l.startswith("profile")]
    print("loco " + prof[-1].strip() if prof else "")
except OSError:
    pass
PY
say "done (status $status)"
exit $status
