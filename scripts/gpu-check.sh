#!/usr/bin/env bash
# The GPU checks of loco in one call, for a machine with one NVIDIA GPU
# (written for the lent H200: CUDA, PyTorch and Python, but none of
# Debian's -dev packages and no network). Steps, each with its own timeout:
#
#   device    nvidia-smi: the GPU's name, driver and memory
#   build     unpack the bundle, or make the GPU test and bench binaries
#   versions  CUDA runtime, driver API, cuBLASLt, NCCL (loco-gpu-bench
#             --bench versions); PyTorch, its CUDA, cuDNN (pytorch_gpt2.py)
#   tests     every GPU test (tests/gpu: each CUDA kernel against its CPU
#             twin, the GPU codecs byte for byte, the nccl backend on one
#             rank, the model's loss and gradients against the CPU model,
#             20 trainer steps with train.device = cuda against cpu)
#   multi-rank  train.device = cuda over one rank of nccl and over two
#             processes sharing the GPU (mpirun, mpi backend), dp = 2 and
#             ZeRO 0-3, tp (GPT-2 and Llama, sp, bf16), cp (Ulysses,
#             ring), pp (every schedule, recompute, bf16) and four
#             processes of their compositions, against the one-rank
#             device run (each run's worst loss difference and tokens/s in
#             the table)
#             (scripts/gpu-dp-check.sh; needs mpirun and a loco built with
#             CUDA and MPI, GPU_CHECK_LOCO, default $BUILD/loco: skipped
#             with the reason where either is missing)
#   benchmarks, each beside its reference:
#     loco-gpt2 / pytorch-eager / pytorch-compile: GPT-2 124M training
#             steps, B=16, T=1024, bf16, fused AdamW (bench/gpu/gpt2_gpu.c,
#             bench/pytorch_gpt2.py); tokens/s and MFU
#     loco-attention / pytorch-sdpa: causal attention forward + backward,
#             B=16, T=1024, 12 heads of 64, bf16, both loco kernels (the
#             reference and the tensor-core one, two rows) against
#             torch.nn.functional.scaled_dot_product_attention
#     loco-codecs: kernels/cuda/quant.cu encode / decode GB/s against a
#             device-to-device cudaMemcpy
#   summary   results.json and table.md (for docs/PERFORMANCE.md, "GPU")
#
# A global deadline (GPU_CHECK_BUDGET seconds, default 469: the steps'
# timeouts add up to less) is checked before each step; a step that would
# overrun it is skipped with the reason. Each step's timeout can be
# changed with GPU_CHECK_T_<STEP> (GPU_CHECK_T_PYTORCH_COMPILE=90, ...).
#
#   scripts/gpu-check.sh --bundle   on a build machine with the -dev packages
#       (scripts/install-deps.sh) and nvcc: builds the GPU test and bench
#       binaries (without MPI) and packs them with the shared libraries the
#       GPU machine lacks into $BUILD/bundle.tar.xz (about 15 MB).
#   scripts/gpu-check.sh            on the GPU machine: uses that bundle when
#       it is there, else builds with make (which needs the -dev packages).
#   scripts/gpu-check.sh --dry-run  anywhere: runs no GPU step (each is
#       reported skipped, "no GPU: dry run", with the reason) and still
#       writes results.json and table.md; checks the script itself.
#
# $BUILD is GPU_CHECK_BUILD, default build-gpu. Outputs go to $OUT when set
# (the device tool brings $OUT back: at most 8 files), else $BUILD/out:
# results.json, table.md, gpu-check.log (this console), tests.log and
# logs.tar.gz (every step's log).
# Exit status: 0 when no test failed or crashed (a skip with a stated reason
# is no failure, except a skip for want of a device on a machine where
# nvidia-smi lists one), no benchmark crashed and the build worked (in a dry
# run: when the results were written); 1 otherwise; 2 for a usage error or,
# without --dry-run, when no GPU was found.
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD=${GPU_CHECK_BUILD:-build-gpu}
BUNDLE=$BUILD/bundle.tar.xz
JOBS=$(nproc 2>/dev/null || echo 4)
PY=${PYTHON:-python3}

mode=run
case "${1:-}" in
  --bundle) mode=bundle ;;
  --dry-run) mode=dry ;;
  "") ;;
  *) echo "usage: scripts/gpu-check.sh [--bundle | --dry-run]" >&2; exit 2 ;;
esac

if [ "$mode" = bundle ]; then
  set -e
  make -j"$JOBS" BUILD="$BUILD" MPI_CFLAGS= MPI_LIBS= "$BUILD/tests/test_gpu" \
    "$BUILD/loco-gpu-bench"
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$BUILD/tests/test_gpu" "$BUILD/loco-gpu-bench" "$stage/bin/"
  # every library the binaries load except the C runtime and the big CUDA
  # libraries (cuBLASLt, NCCL), which the GPU machine has
  for lib in $(ldd "$BUILD/tests/test_gpu" "$BUILD/loco-gpu-bench" |
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

# ----------------------------------------------------------------- budget
# Seconds per step (the timeout it runs under; a step that overruns is
# killed 2 s later). They add up to 474 s, the summary's 10 s included: the
# others' 464 s are under the 469 s deadline; a step
# starts only if its timeout and grace fit before the deadline, and the
# summary (10 s at most) runs last whatever is left: under 8 minutes, the
# most one device call may take, build included.
STEPS="device build versions tests multi-rank loco-gpt2 loco-recompute loco-attention loco-codecs
       pytorch-sdpa pytorch-eager pytorch-compile summary"
# (tests ran 20 s of its 90 on the first H200, 2026-12-04: 20 of them went
# to loco-recompute)
# (multi-rank: forty-five tiny runs, process start-up most of each,
# twelve of them four processes on the one GPU, never yet timed on a GPU;
# 120 s, taken from tests, whose 20 s leave room under 40, loco-recompute
# and pytorch-eager, then (the pipeline's and the experts' runs,
# 2026-12-06) from pytorch-compile (36 s of 65 on the first H200),
# loco-gpt2 (11 of 35), pytorch-sdpa (8 of 20) and build (1 s of 140 with
# the build carried; a make -j16 from scratch stays well under 120))
declare -A BUDGET=([device]=10 [build]=120 [versions]=20 [tests]=40 [multi-rank]=120
                   [loco-gpt2]=25 [loco-recompute]=15 [loco-attention]=15 [loco-codecs]=15
                   [pytorch-sdpa]=12 [pytorch-eager]=25 [pytorch-compile]=47 [summary]=10)
for s in $STEPS; do
  v=GPU_CHECK_T_$(tr 'a-z-' 'A-Z_' <<<"$s")
  BUDGET[$s]=${!v:-${BUDGET[$s]}}
done
TOTAL=${GPU_CHECK_BUDGET:-469}

OUTDIR=${OUT:-$BUILD/out}
mkdir -p "$OUTDIR"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$OUTDIR/gpu-check.log") 2>&1
tee_pid=$!
t_start=$(date +%s)
DEADLINE=$(( t_start + TOTAL ))
say() { echo "gpu-check [$(( $(date +%s) - t_start ))s]: $*"; }
: >"$WORK/steps.tsv"
# record name status rc seconds reason
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$WORK/steps.tsv"; }
NO_GPU=""   # the reason the GPU steps are skipped, when they are
BROKEN=""   # the reason the steps that need loco's binaries are skipped

# step NAME COMMAND...: runs COMMAND under NAME's timeout, its output in
# $WORK/NAME.log; skipped (with the reason) without a GPU, when the
# deadline is near, or (the tests and loco's benchmarks) when the build
# did not work. Sets step_rc (empty when skipped).
step() {
  local name=$1 secs=${BUDGET[$1]}
  shift
  local left=$(( DEADLINE - $(date +%s) ))
  step_rc=""
  if [ -n "$NO_GPU" ]; then
    say "$name: skipped: $NO_GPU"
    record "$name" skipped "" 0 "$NO_GPU"
    return
  fi
  if [ -n "$BROKEN" ] && [[ $name == tests || $name == loco-* ]]; then
    say "$name: skipped: $BROKEN"
    record "$name" skipped "" 0 "$BROKEN"
    return
  fi
  if (( left < secs + 2 )); then
    local why="deadline near: ${left}s left of the ${TOTAL}s budget, the step's timeout is ${secs}s"
    say "$name: skipped: $why"
    record "$name" skipped "" 0 "$why"
    return
  fi
  say "$name (timeout ${secs}s)"
  local t0
  t0=$(date +%s)
  timeout -k 2 "$secs" "$@" >"$WORK/$name.log" 2>&1
  step_rc=$?
  local dt=$(( $(date +%s) - t0 )) status=ok why=""
  if [ $step_rc -eq 0 ]; then
    :
  elif [ $step_rc -eq 124 ] || { [ $step_rc -eq 137 ] && (( dt >= secs )); }; then
    status=timed_out why="timed out after ${secs}s"
  elif (( step_rc > 128 && step_rc < 160 )); then
    status=crashed why="killed by signal $(( step_rc - 128 )) ($(kill -l $(( step_rc - 128 )) 2>/dev/null))"
  else
    status=failed why="exit status $step_rc"
  fi
  record "$name" "$status" "$step_rc" "$dt" "$why"
  if [ "$status" = ok ]; then
    grep -a '^{' "$WORK/$name.log" | tail -n 1
  else
    say "$name: $status: $why; its log ends:"
    tail -n 15 "$WORK/$name.log"
  fi
}

# ----------------------------------------------------------------- device
say "budget: ${TOTAL}s in all; $(for s in $STEPS; do printf '%s %ss, ' "$s" "${BUDGET[$s]}"; done)"
gpu=$(timeout -k 2 "${BUDGET[device]}" nvidia-smi --query-gpu=name,driver_version,memory.total \
      --format=csv,noheader 2>&1)
gpu_rc=$?
gpu=$(head -n 1 <<<"$gpu")  # the first GPU: the one the binaries use
if [ "$mode" = dry ]; then
  NO_GPU="no GPU: dry run (--dry-run runs no GPU step)"
  [ $gpu_rc -eq 0 ] && [ -n "$gpu" ] || gpu="none (nvidia-smi: ${gpu:-no output})"
  record device skipped "" 0 "$NO_GPU; nvidia-smi says: $gpu"
elif [ $gpu_rc -ne 0 ] || [ -z "$gpu" ] || ! grep -q , <<<"$gpu"; then
  NO_GPU="no GPU: nvidia-smi finds none (${gpu:-no output})"
  gpu="none"
  record device failed "$gpu_rc" 0 "$NO_GPU"
else
  record device ok 0 0 ""
fi
printf '%s\n' "$gpu" >"$WORK/device.txt"
say "device: $gpu"

# CUDA libraries: the toolkit's, then the ones PyTorch's wheels bring
# (nvidia/<part>/lib, or nvidia/cu13/lib in the CUDA 13 wheels).
CUDA_LIBS=/usr/local/cuda/lib64
if [ -z "$NO_GPU" ]; then
  wheel_libs=$("$PY" - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = list(nvidia.__path__)
except ImportError:
    roots = []
dirs = sorted({os.path.dirname(f) for r in roots
               for f in glob.glob(os.path.join(r, "*", "lib", "lib*.so*"))
               + glob.glob(os.path.join(r, "*", "*", "lib", "lib*.so*"))})
print(":".join(dirs))
PY
)
  [ -n "$wheel_libs" ] && CUDA_LIBS="$CUDA_LIBS:$wheel_libs"
fi

# ------------------------------------------------------------------ build
if [ "$mode" = dry ]; then
  why="no GPU: dry run (no build; a real run unpacks $BUNDLE or runs make -j$JOBS)"
  say "build: skipped: $why"
  record build skipped "" 0 "$why"
  TESTBIN=$BUILD/tests/test_gpu BENCHBIN=$BUILD/loco-gpu-bench LOCO_LD=""
elif [ -f "$BUNDLE" ]; then
  # xz, or Python's tarfile where the xz program is missing
  # shellcheck disable=SC2016 # $1..$3: bash -c's own arguments
  step build bash -c 'mkdir -p "$1" && if command -v xz >/dev/null; then tar -C "$1" -xJf "$2"
    else "$3" -m tarfile -e "$2" "$1"; fi' unpack "$WORK/bundle" "$BUNDLE" "$PY"
  TESTBIN=$WORK/bundle/bin/test_gpu
  BENCHBIN=$WORK/bundle/bin/loco-gpu-bench
  LOCO_LD="$WORK/bundle/lib:$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
else
  step build make -j"$JOBS" BUILD="$BUILD" MPI_CFLAGS= MPI_LIBS= "$BUILD/tests/test_gpu" \
    "$BUILD/loco-gpu-bench"
  TESTBIN=$BUILD/tests/test_gpu
  BENCHBIN=$BUILD/loco-gpu-bench
  LOCO_LD="$CUDA_LIBS:${LD_LIBRARY_PATH:-}"
fi
if [ "$mode" = run ] && [ -z "$NO_GPU" ] && [ "${step_rc:-x}" != 0 ]; then
  BROKEN="no binaries: the build did not work (without Debian's -dev packages, run"
  BROKEN="$BROKEN 'scripts/gpu-check.sh --bundle' on a build machine and carry $BUNDLE)"
  say "$BROKEN"
fi

# ------------------------------------------------------ versions and tests
# loco's libraries (the bundle's) for loco's binaries alone, never for python3
# shellcheck disable=SC2016 # $1..$3: bash -c's own arguments
step versions bash -c 'env LD_LIBRARY_PATH="$1" "$2" --bench versions; r=$?
  "$3" bench/pytorch_gpt2.py --mode versions || r=$?; exit $r' versions "$LOCO_LD" "$BENCHBIN" "$PY"
step tests env LD_LIBRARY_PATH="$LOCO_LD" "$TESTBIN" --verbose --jobs "$(( JOBS > 8 ? 8 : JOBS ))"
[ -f "$WORK/tests.log" ] && cp "$WORK/tests.log" "$OUTDIR/tests.log" &&
  grep -a -E "^\[(FAIL|SKIP)\]|Synthesis" "$WORK/tests.log"

# ------------------------------------------------------------ multi-rank
# train.device = cuda over one rank of nccl and two processes sharing the
# GPU through the mpi backend, against one rank (scripts/gpu-dp-check.sh).
# The bundle's binaries have no MPI: this needs mpirun and a loco built with
# CUDA and MPI on this machine.
DP_LOCO=${GPU_CHECK_LOCO:-$BUILD/loco}
dp_why=""
if ! command -v mpirun >/dev/null 2>&1; then
  dp_why="no mpirun on this machine (the two processes share the GPU over the mpi backend)"
elif [ ! -x "$DP_LOCO" ]; then
  dp_why="no $DP_LOCO (a loco built with CUDA and MPI; GPU_CHECK_LOCO names another)"
elif ! compgen -G "data/kjv_train_*.bin" >/dev/null; then
  dp_why="no data/kjv_train_*.bin (make data)"
fi
if [ -z "$NO_GPU" ] && [ -n "$dp_why" ]; then
  say "multi-rank: skipped: $dp_why"
  record multi-rank skipped "" 0 "$dp_why"
else
  step multi-rank env LD_LIBRARY_PATH="$LOCO_LD" bash scripts/gpu-dp-check.sh "$DP_LOCO"
fi

# ------------------------------------------------------------- benchmarks
export PYTHONUNBUFFERED=1
step loco-gpt2 env LD_LIBRARY_PATH="$LOCO_LD" "$BENCHBIN" --bench gpt2 --batch 16 --seq 1024 \
  --steps 20 --warmup 3 --profile 3 --graph both
# the same steps with every block under full recompute: speed and memory
step loco-recompute env LD_LIBRARY_PATH="$LOCO_LD" "$BENCHBIN" --bench gpt2 --batch 16 --seq 1024 \
  --steps 10 --warmup 2 --graph off --recompute 12
step loco-attention env LD_LIBRARY_PATH="$LOCO_LD" "$BENCHBIN" --bench attention --batch 16 \
  --seq 1024 --heads 12 --embd 768
step loco-codecs env LD_LIBRARY_PATH="$LOCO_LD" "$BENCHBIN" --bench codecs
step pytorch-sdpa "$PY" bench/pytorch_gpt2.py --mode sdpa --batch 16 --seq 1024 --heads 12 \
  --embd 768
step pytorch-eager "$PY" bench/pytorch_gpt2.py --mode eager --steps 20 --warmup 3
step pytorch-compile "$PY" bench/pytorch_gpt2.py --mode compile --steps 20 --warmup 3

# ---------------------------------------------------------------- summary
say "summary"
cmd="scripts/gpu-check.sh${1:+ $1}"
[ -n "${GPU_CHECK_BUILD:-}" ] && cmd="GPU_CHECK_BUILD=$GPU_CHECK_BUILD $cmd"
if [ "$mode" = run ]; then
  if [ -f "$BUNDLE" ]; then how=bundle; else how=build; fi
else
  how=dry-run
fi
budget=$(for s in $STEPS; do printf '%s=%s ' "$s" "${BUDGET[$s]}"; done)
timeout -k 2 "${BUDGET[summary]}" "$PY" - "$WORK" "$OUTDIR" "$how" "$cmd" "$TOTAL" "$budget" \
  "$(( $(date +%s) - t_start ))" <<'PY'
import datetime, glob, json, os, re, sys

work, out, how, cmd, total, budget, elapsed = sys.argv[1:8]
budget = {k: int(v) for k, v in (kv.split("=") for kv in budget.split())}


def read(name):
    try:
        with open(os.path.join(work, name), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def json_lines(name):
    rows = []
    for line in read(name + ".log").splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


steps = []
for line in read("steps.tsv").splitlines():
    name, status, rc, secs, reason = (line.split("\t") + [""] * 5)[:5]
    steps.append({"name": name, "status": status, "rc": int(rc) if rc else None,
                  "seconds": int(secs or 0), "timeout_s": budget.get(name), "reason": reason})
by_step = {s["name"]: s for s in steps}
gpu_seen = by_step.get("device", {}).get("status") == "ok"

# device and versions
smi = read("device.txt").strip()
parts = [p.strip() for p in smi.split(",")] if gpu_seen else []
ver = {}
for row in json_lines("versions"):  # loco-gpu-bench's line, then PyTorch's
    if "torch" in row:
        row = {"torch": row.get("torch"), "torch_cuda": row.get("torch_cuda"),
               "cudnn": row.get("cudnn"), "torch_nccl": row.get("nccl")}
    ver.update({k: v for k, v in row.items() if v is not None and k != "bench"})
device = {"name": parts[0] if parts else None,
          "driver_version": parts[1] if len(parts) > 1 else None,
          "memory": parts[2] if len(parts) > 2 else None,
          "cuda_runtime": ver.get("cuda_runtime"), "cuda_driver_api": ver.get("cuda_driver_api"),
          "cublaslt": ver.get("cublaslt"), "nccl": ver.get("nccl"), "cudnn": ver.get("cudnn"),
          "torch": ver.get("torch"), "torch_cuda": ver.get("torch_cuda"),
          "torch_nccl": ver.get("torch_nccl"),
          "nvidia_smi": smi}

# tests: Criterion's --verbose lines and its Synthesis line
tests = {"status": by_step.get("tests", {}).get("status"), "tested": 0, "passed": 0,
         "failed": 0, "crashed": 0, "skipped": [], "failures": [], "unexpected_skips": []}
log = read("tests.log")
if tests["status"] == "skipped":
    # the suites that would have run (tests/gpu), each with the step's reason
    suites = sorted({m for f in glob.glob("tests/gpu/*.c")
                     for m in re.findall(r"^Test\(\s*(\w+)", open(f).read(), re.M)})
    tests["skipped"] = [{"name": s + "::*", "reason": by_step["tests"]["reason"]} for s in suites]
else:
    for m in re.finditer(r"^\[SKIP\] (\S+?): (.*)$", log, re.M):
        tests["skipped"].append({"name": m.group(1), "reason": m.group(2).strip()})
    for m in re.finditer(r"^\[FAIL\] (\S+?): (.*)$", log, re.M):
        tests["failures"].append({"name": m.group(1), "detail": m.group(2).strip()})
    passed = len(re.findall(r"^\[PASS\] ", log, re.M))
    crashed = sum(f["detail"].startswith("CRASH") for f in tests["failures"])
    syn = re.findall(r"Synthesis: Tested: (\d+) \| Passing: (\d+) \| Failing: (\d+) \| "
                     r"Crashing: (\d+)", log)
    if syn:  # Criterion counts a crash among the failures too
        tested, passing, failing, crashing = map(int, syn[-1])
        tests.update(tested=tested, passed=passing, failed=failing - crashing, crashed=crashing)
    else:  # cut short (timeout, crash of the runner): what the lines say
        tests.update(tested=passed + len(tests["failures"]), passed=passed,
                     failed=len(tests["failures"]) - crashed, crashed=crashed)
    # a test that skipped for want of a device, or of the CUDA build, where
    # nvidia-smi lists a GPU checked nothing: that is a failure of the check
    # (a build without NCCL is a stated limit of the machine that built it)
    if gpu_seen:
        tests["unexpected_skips"] = [
            s["name"] for s in tests["skipped"]
            if re.match(r"no CUDA device|built without the CUDA toolkit", s["reason"])]

# benchmarks
def last(name, key=None, value=None):
    rows = [r for r in json_lines(name) if key is None or r.get(key) == value]
    return rows[-1] if rows else None

def bench_status(name):
    s = by_step.get(name, {})
    return s.get("status"), s.get("reason")

gpt2 = {}
for impl in ("loco-gpt2", "pytorch-eager", "pytorch-compile"):
    rows = [r for r in json_lines(impl) if "tok_per_s" in r]
    r = rows[-1] if rows else {}
    st, why = bench_status(impl)
    gpt2[impl] = {"status": st, "reason": why, **{k: r.get(k) for k in
                  ("step_ms", "tok_per_s", "mfu", "loss_first", "loss_last", "params")}}
L, C, T, V = 12, 768, 1024, 50304
flops_tok = 6.0 * (L * 12.0 * C * C + V * C) + 12.0 * L * C * T

benchmarks = []

def add(name, loco_step, loco_v, ref_step, ref_v, ref_name, unit):
    ls, lw = bench_status(loco_step)
    rs, rw = bench_status(ref_step)
    ratio = round(loco_v / ref_v, 3) if loco_v and ref_v else None
    notes = []
    for s, st, w in ((loco_step, ls, lw), (ref_step, rs, rw)):
        n = f"{st}: {w}" if w else str(st)
        if st != "ok" and n not in notes:
            notes.append(n)
    benchmarks.append({"name": name, "loco": loco_v, "reference": ref_v,
                       "reference_name": ref_name, "unit": unit, "ratio": ratio,
                       "status": "ok" if ratio is not None else "incomplete",
                       "note": "; ".join(notes)})

lg = gpt2["loco-gpt2"]
tv = "PyTorch " + ver["torch"] if ver.get("torch") else "PyTorch"
for ref, what in (("pytorch-eager", f"{tv} eager"), ("pytorch-compile", f"{tv} torch.compile")):
    add(f"gpt2_124m_train_tokens_per_s_vs_{ref.split('-')[1]}", "loco-gpt2", lg["tok_per_s"],
        ref, gpt2[ref]["tok_per_s"],
        what + " (same model, B=16 T=1024, bf16 autocast, SDPA, fused AdamW)", "tokens/s")
# full recompute of every block against none (loco-gpt2's last line: graph off)
rows = [r for r in json_lines("loco-recompute") if "tok_per_s" in r]
rr = rows[-1] if rows else {}
nr = ([r for r in json_lines("loco-gpt2") if "tok_per_s" in r] or [{}])[-1]
add("gpt2_124m_full_recompute_tokens_per_s", "loco-recompute", rr.get("tok_per_s"),
    "loco-gpt2", nr.get("tok_per_s"), "loco without recompute (the same bench, graph off)",
    "tokens/s")
add("gpt2_124m_full_recompute_activation_mib", "loco-recompute", rr.get("act_mib"),
    "loco-gpt2", nr.get("act_mib"), "loco without recompute: the blocks' activations", "MiB")
# two loco kernels, each beside SDPA: the reference (attention.cu, CUDA
# cores; lines without "kernel" are its) and the tensor-core one
att = [r for r in json_lines("loco-attention") if r.get("bench") == "attention"]
la = next((r for r in reversed(att) if r.get("kernel", "reference") == "reference"), {})
lt = next((r for r in reversed(att) if r.get("kernel") == "tensor"), {})
pa = last("pytorch-sdpa", "bench", "attention") or {}
sdpa = f"torch.nn.functional.scaled_dot_product_attention, causal, bf16 ({tv})"
add("attention_fwd_bwd_B16_T1024_12x64_bf16", "loco-attention", la.get("tflops"),
    "pytorch-sdpa", pa.get("tflops"), sdpa + " vs loco's reference kernel", "TFLOP/s")
add("attention_tc_fwd_bwd_B16_T1024_12x64_bf16", "loco-attention", lt.get("tflops"),
    "pytorch-sdpa", pa.get("tflops"), sdpa + " vs loco's tensor-core kernel", "TFLOP/s")
if lt.get("skipped"):
    benchmarks[-1]["note"] = "; ".join(x for x in (benchmarks[-1]["note"], lt["skipped"]) if x)
mc = last("loco-codecs", "bench", "memcpy_d2d") or {}
codec_rows = [r for r in json_lines("loco-codecs") if r.get("bench") == "codec"]
if not codec_rows:  # what would have been measured
    codec_rows = [{"codec": c, "op": op} for c in ("bf16", "int8", "int4", "fp8", "fp4")
                  for op in ("encode", "decode")]
for r in codec_rows:
    add(f"codec_{r['codec']}_{r['op']}_2^27_floats", "loco-codecs", r.get("gbps"),
        "loco-codecs", mc.get("gbps"),
        "cudaMemcpy device-to-device, same floats (bytes read + written)", "GB/s")

# the multi-rank runs (scripts/gpu-dp-check.sh's JSON lines): each
# dimension against one rank on the one GPU
multi = [r for r in json_lines("multi-rank") if "run" in r]

# exit status: tests failed or crashed, a benchmark crashed, the build failed
bench_steps = ("loco-gpt2", "loco-recompute", "loco-attention", "loco-codecs", "pytorch-sdpa",
               "pytorch-eager", "pytorch-compile")
problems = []
if how != "dry-run":
    if by_step.get("build", {}).get("status") not in ("ok",):
        problems.append("build " + str(by_step.get("build", {}).get("status")))
    if tests["status"] in ("timed_out", "crashed") or tests["failed"] or tests["crashed"]:
        problems.append(f"tests: {tests['failed']} failed, {tests['crashed']} crashed"
                        + (f", the run {tests['status'].replace('_', ' ')}"
                           if tests["status"] in ("timed_out", "crashed") else ""))
    if tests["unexpected_skips"]:
        problems.append(f"tests: {len(tests['unexpected_skips'])} skipped for want of a device")
    problems += [f"benchmark {b} crashed" for b in bench_steps
                 if by_step.get(b, {}).get("status") == "crashed"]
    problems += [f"multi-rank {r['run']} differs from one rank" for r in multi if not r.get("ok")]
if how != "dry-run" and not gpu_seen:
    problems = ["no GPU found: nothing was checked"]
    exit_status = 2
else:
    exit_status = 1 if problems else 0

date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
res = {"schema": 1, "date": date, "command": cmd, "how": how, "device": device,
       "budget_s": {"total": int(total), "steps": budget}, "elapsed_s": int(elapsed),
       "steps": steps, "tests": tests,
       "gpt2": {"model": "GPT-2 124M (vocab 50304)", "B": 16, "T": 1024,
                "flops_per_token": flops_tok, "flops_formula": "6 N_matmul + 12 L C T (llm.c)",
                "peak_tflops": 989.0, "runs": gpt2},
       "benchmarks": benchmarks, "multi_rank": multi, "problems": problems,
       "exit_status": exit_status}
with open(os.path.join(out, "results.json"), "w") as f:
    json.dump(res, f, indent=1)

# table.md
def num(v, unit=""):
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}" if unit != "x" else f"{v:.2f}"

d = device
vers = ", ".join(f"{label} {d[k]}" for k, label in
                 (("driver_version", "driver"), ("cuda_runtime", "CUDA runtime"),
                  ("cublaslt", "cuBLASLt"), ("nccl", "NCCL"), ("torch", "PyTorch"),
                  ("torch_cuda", "its CUDA"), ("cudnn", "cuDNN")) if d.get(k))
md = [f"#### {date[:10]}, {d['name'] or 'no GPU'}" + (f" ({vers})" if vers else ""), "",
      f"Command: `{cmd}` ({'dry run: nothing measured' if how == 'dry-run' else how}), "
      f"{elapsed} s of a {total} s budget.", ""]
sk = tests["skipped"]
md.append(f"Tests: {tests['passed']} passed, {tests['failed']} failed, {tests['crashed']} crashed, "
          f"{len(sk)} skipped" + (":" if sk else "."))
reasons = {}
for s in sk:
    reasons.setdefault(s["reason"], []).append(s["name"])
for why, names in reasons.items():
    md.append(f"- {', '.join(names)}: {why}")
md += ["", "| benchmark | loco | reference | unit | loco / reference | the reference | status |",
       "|---|---|---|---|---|---|---|"]
for b in benchmarks:
    md.append(f"| {b['name']} | {num(b['loco'])} | {num(b['reference'])} | {b['unit']} | "
              f"{num(b['ratio'], 'x')} | {b['reference_name']} | {b['note'] or 'ok'} |")
md += ["", f"GPT-2 124M training, B=16, T=1024, bf16; MFU = tokens/s x {flops_tok / 1e9:.3f} GFLOP"
       " per token (6N + 12 L C T) / 989 TFLOP/s:", "",
       "| implementation | step ms | tokens/s | MFU | loss first -> last | status |",
       "|---|---|---|---|---|---|"]
for impl, r in gpt2.items():
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "—"
    loss = (f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"
            if r["loss_first"] is not None else "—")
    md.append(f"| {impl} | {num(r['step_ms'])} | {num(r['tok_per_s'])} | {mfu} | {loss} | "
              f"{r['status']}" + (f": {r['reason']}" if r["reason"] else "") + " |")
ms = by_step.get("multi-rank", {})
md += ["", "Multi-rank runs on the one GPU (scripts/gpu-dp-check.sh; mpi staged through the "
       "host, tiny model: agreement, not speed): " + str(ms.get("status")) +
       (f": {ms.get('reason')}" if ms.get("reason") else ""), ""]
if multi:
    md += ["| run | steps | worst loss rel. diff vs one rank | bound | tokens/s | ok |",
           "|---|---|---|---|---|---|"]
    for r in multi:
        md.append(f"| {r['run']} | {r.get('steps')} | {r.get('worst_rel_diff', 0):.3g} | "
                  f"{r.get('tol', 1e-5):.0e} | {num(r.get('tokens_per_s'))} | "
                  f"{'yes' if r.get('ok') else 'NO'} |")
prof = [l for l in read("loco-gpt2.log").splitlines() if l.startswith("profile")]
if prof:
    md += ["", "loco " + prof[-1].strip()]
md += ["", "Steps: " + ", ".join(f"{s['name']} {s['status']} {s['seconds']}/{s['timeout_s']} s"
                                 for s in steps)]
if problems:
    md += ["", "Problems: " + "; ".join(problems)]
with open(os.path.join(out, "table.md"), "w") as f:
    f.write("\n".join(md) + "\n")
print("\n".join(md))
sys.exit(exit_status)
PY
status=$?
(( status > 2 )) && { echo "gpu-check: the summary failed (exit $status)"; status=1; }
(cd "$WORK" && tar -czf "$OUTDIR/logs.tar.gz" -- *.log steps.tsv device.txt 2>/dev/null)
files="results.json table.md gpu-check.log logs.tar.gz"
[ -f "$OUTDIR/tests.log" ] && files="$files tests.log"
say "done (status $status); in $OUTDIR: $files"
exec >&- 2>&-
wait "$tee_pid"
exit $status
