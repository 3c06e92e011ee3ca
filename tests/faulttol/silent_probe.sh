#!/usr/bin/env bash
# A fresh run of three islands (outer.algorithm = auto: they probe their
# links at start-up) while siteC is silent: it registers and is stopped
# (SIGSTOP) before the others start, so their probe gets nothing from it.
# Before issue 30 siteA and siteB exited 1 at start-up (the probe's timeout
# ended loco_island_create); now each falls back to all-gather with a
# warning and trains. siteC is continued once siteA said so: it is
# suspected by then, probes nobody, falls back too and rejoins. Every
# process must exit 0. Waits are for log lines, never a fixed sleep.
#
#   tests/faulttol/silent_probe.sh OUT_DIR     (LOCO_BIN: the loco binary)
set -u
out=${1:?usage: silent_probe.sh OUT_DIR}
loco=${LOCO_BIN:-build/loco}
mkdir -p "$out/logs"

pick_port() {
  local p
  for ((i = 0; i < 200; i++)); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM + $$) % 12000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { PORT=$p; return 0; }
  done
  echo "silent_probe.sh: no free port" >&2
  return 1
}
pick_port || exit 1

cfg=$out/run.ini
cat >"$cfg" <<EOF
[model]
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
vocab_size = 256
[train]
batch_size = 4
steps = 1000
lr = 3e-3
seed = 1337
[data]
train = data/kjv_train_*.bin
val = data/kjv_val_*.bin
[run]
log_every = 100000
eval_every = 0
threads = 1
[outer]
H = 10
sites = siteA,siteB,siteC
algorithm = auto
[net]
tls = false
; paces the run: siteC, continued, must find it still going
wan_delay_ms = 10
[faulttol]
coordinator = 127.0.0.1:$PORT
heartbeat_ms = 50
phi_pause_ms = 500
timeout_ms = 3000
coordinator_grace_s = 30
EOF

pids=()
cleanup() {
  for p in "${pids[@]}"; do
    kill -CONT "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
}
trap cleanup EXIT

# Waits until FILE holds PATTERN (a fixed string); fails after SECONDS.
wait_for() {
  local file=$1 pattern=$2 secs=$3 t0=$SECONDS
  until grep -aqF -- "$pattern" "$file" 2>/dev/null; do
    if (( SECONDS - t0 > secs )); then
      echo "silent_probe.sh: no '$pattern' in $file within $secs s" >&2
      return 1
    fi
    sleep 0.05
  done
}

"$loco" coordinator "$cfg" --set run.dir="$out/run" >"$out/logs/coordinator.log" 2>&1 &
cpid=$!
pids+=("$cpid")
island() { # site
  "$loco" island "$cfg" --site "$1" --set run.dir="$out/run/$1" >"$out/logs/$1.log" 2>&1 &
  pids+=($!)
}
wait_for "$out/logs/coordinator.log" "listening on" 30 || exit 1
island siteC
cpid_c=${pids[-1]}
wait_for "$out/logs/coordinator.log" "siteC registered" 30 || exit 1
kill -STOP "$cpid_c"
echo "siteC stopped (SIGSTOP) after registering"
island siteA
apid=${pids[-1]}
island siteB
bpid=${pids[-1]}
wait_for "$out/logs/siteA.log" "link probe failed" 30 || exit 1
kill -CONT "$cpid_c"
echo "siteA's probe fell back; siteC continued (SIGCONT)"

status=0
for p in $apid $bpid $cpid_c $cpid; do
  wait "$p"
  rc=$?
  echo "process $p exited $rc"
  [ "$rc" -eq 0 ] || status=1
done
trap - EXIT
for s in siteA siteB siteC; do
  if [ ! -s "$out/run/$s/outer.jsonl" ]; then
    echo "$s recorded no outer step"
    status=1
  fi
done
grep -a "link probe\|all-gather until" "$out/logs/"site*.log
exit $status
