#!/usr/bin/env bash
# Chaos test (docs/FAULTS.md, "Chaos test"): a coordinator and K islands
# started by hand (plain `loco coordinator` / `loco island` processes, no
# `loco launch`, nothing restarts what exits on its own), then N actions
# drawn from a seed, each at a seeded outer step plus a seeded delay:
#
#   kill_resume   SIGKILL an island, restart it with --resume RUN_DIR (its newest valid checkpoint)
#   kill_fresh    SIGKILL an island, restart it without --resume (joins by state transfer)
#   kill_ckpt     SIGKILL an island, restart it with --resume of an older checkpoint
#   kill_corrupt  SIGKILL an island, truncate its newest checkpoint's model.safetensors,
#                 restart it with --resume RUN_DIR (falls back to the previous one)
#   kill_exchange SIGKILL an island a few ms after its log says it is ready for an
#                 outer step (coordinator round trips and the exchange in flight)
#   stop_cont     SIGSTOP an island, SIGCONT it after a seeded pause
#   kill_coord    SIGKILL the coordinator, restart it on the same address, port and
#                 certificates after a seeded delay (the islands wait it out:
#                 faulttol.coordinator_grace_s)
#
# One action at a time: the next one waits until the previous one recovered
# (an outer step committed by all K islands). A watchdog fails the run when
# no outer step commits for --watchdog seconds. At the end every island's
# last process must have exited 0, and every island must hold the same
# θ_global (the theta_hash of its last outer.jsonl record, equal to the
# coordinator's last commit), and no outer step may be committed with two
# hashes on the timeline. A fault-free run of the same config (first, in
# OUT/baseline, reused when it finished; or --baseline DIR) gives the final
# loss to compare with. Writes OUT/summary.md (every action with its time,
# detection and recovery, the hashes, the final losses) and `loco report`'s
# OUT/run/report.md. Exit status: 0 when every check passed, 1 when one
# failed, 2 on a usage error.
#
# Usage: scripts/chaos.sh [--islands K] [--actions N] [--seed S] [--steps N]
#          [--H H] [--out DIR] [--watchdog SECONDS] [--kinds a,b,...] [--hog N]
#          [--baseline DIR | --no-baseline] [--short] [--set KEY=VALUE ...]
# LOCO_BIN names the loco binary (default build/loco).
set -uo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  cat <<'EOF'
Options:
  --islands K       islands (default 4)
  --actions N       chaos actions (default 20; 0 = a fault-free run only)
  --seed S          seed of the actions, sites, moments, pauses (default 1)
  --steps N         inner steps (default: enough for N actions, see below)
  --H H             inner steps per outer step (default 5)
  --out DIR         output directory (default runs/chaos-sS)
  --watchdog S      fail when no outer step commits for S seconds (default 120)
  --wan-ms D        one-way delay on every link, ms (default 25: net.wan_delay_ms;
                    it paces the run, so that wall time depends less on the load)
  --kinds LIST      the actions to draw from (default: all seven)
  --baseline DIR    the fault-free run to compare with (a finished OUT/baseline)
  --no-baseline     no fault-free run (no loss comparison)
  --short           3 islands, 3 actions (kill_resume, stop_cont, kill_coord),
                    400 steps, watchdog 60 s: the
                    make-test version
  --hog N           N busy processes (CPU hogs) beside the chaos run, for a
                    load far above the core count (default 0; not beside the
                    fault-free run)
  --set KEY=VALUE   config override for every process (repeatable)
EOF
}

islands=4 n_actions=20 seed=1 steps=0 H=5 out="" watchdog=120 kinds="" baseline="" wan=25 hog=0
no_baseline=0 short=0 islands_given=0
sets=()
cmdline="scripts/chaos.sh $*"
while [ $# -gt 0 ]; do
  case $1 in
    --islands) islands=${2:?}; islands_given=1; shift 2 ;;
    --actions) n_actions=${2:?}; shift 2 ;;
    --seed) seed=${2:?}; shift 2 ;;
    --steps) steps=${2:?}; shift 2 ;;
    --H) H=${2:?}; shift 2 ;;
    --out) out=${2:?}; shift 2 ;;
    --watchdog) watchdog=${2:?}; shift 2 ;;
    --wan-ms) wan=${2:?}; shift 2 ;;
    --kinds) kinds=${2:?}; shift 2 ;;
    --baseline) baseline=${2:?}; shift 2 ;;
    --no-baseline) no_baseline=1; shift ;;
    --short) short=1; shift ;;
    --hog) hog=${2:?}; shift 2 ;;
    --set) sets+=(--set "${2:?}"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "chaos.sh: unexpected argument: $1 (--help lists the options)" >&2; exit 2 ;;
  esac
done
if [ "$short" = 1 ]; then
  # Explicit options given after --short still win: only defaults change.
  [ "$islands_given" = 1 ] || islands=3
  n_actions=3 watchdog=60
  [ "$steps" = 0 ] && steps=400
  kinds=${kinds:-kill_resume,stop_cont,kill_coord}
fi
for v in islands n_actions seed steps H watchdog wan hog; do
  [[ ${!v} =~ ^[0-9]+$ ]] || { echo "chaos.sh: --${v/n_/} expects a number, got '${!v}'" >&2; exit 2; }
done
[ "$islands" -ge 2 ] && [ "$islands" -le 26 ] || { echo "chaos.sh: --islands expects 2..26" >&2; exit 2; }
[ "$H" -ge 1 ] || { echo "chaos.sh: --H expects >= 1" >&2; exit 2; }
[ -n "${EPOCHREALTIME:-}" ] || { echo "chaos.sh: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; }
all_kinds=kill_resume,kill_fresh,kill_ckpt,kill_corrupt,kill_exchange,stop_cont,kill_coord
kinds=${kinds:-$all_kinds}
IFS=, read -r -a pool <<<"$kinds"
for k in "${pool[@]}"; do
  [[ ",$all_kinds," == *",$k,"* ]] || { echo "chaos.sh: unknown action '$k' (one of $all_kinds)" >&2; exit 2; }
done
out=${out:-runs/chaos-s$seed}
loco=${LOCO_BIN:-build/loco}
[ -x "$loco" ] || { echo "chaos.sh: no loco binary at $loco (make, or set LOCO_BIN)" >&2; exit 2; }
loco=$(cd "$(dirname "$loco")" && pwd)/$(basename "$loco")
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

# The schedule, in committed outer steps: the first action after FIRST, one
# every GAP (plus up to GAP/2 of jitter), each once the one before recovered;
# the run is long enough that the last one still leaves a third of it. An
# action is skipped (and said so) when, at the pace of the run, it would
# end before the action recovered.
FIRST=10 GAP=30
[ "$short" = 1 ] && FIRST=5 GAP=10
if [ "$steps" = 0 ]; then
  steps=$(( (FIRST + n_actions * GAP + GAP) * H * 3 / 2 ))
  [ "$steps" -lt 200 ] && steps=200
fi
steps=$(( (steps + H - 1) / H * H )) # the last step ends an outer step
outer_total=$(( steps / H ))
stop_at=$(( outer_total * 9 / 10 ))

# ------------------------------------------------------------------ PRNG
# A 31-bit LCG of our own (bash's RANDOM changed between versions): the
# same seed gives the same actions on every machine. Call as `rnd N`
# (R = 0..N-1), never in a subshell.
rng=$(( seed % 2147483648 ))
rnd() {
  rng=$(( (rng * 1103515245 + 12345) % 2147483648 ))
  R=$(( (rng >> 8) % $1 ))
}

# ----------------------------------------------------------- time, events
now_ms() { local t=${EPOCHREALTIME/./}; MS=$(( 10#$t / 1000 )); }
ev() { printf '{"t":%.3f,%s}\n' "$EPOCHREALTIME" "$1" >>"$events"; }
secs() { printf '%d.%03d' $(( $1 / 1000 )) $(( $1 % 1000 )); }
log() { printf '[chaos %6.1f s] %s\n' "$(( (${EPOCHREALTIME/./} / 1000 - T0) ))e-3" "$*"; }

sites=()
for ((k = 0; k < islands; k++)); do sites+=("site$(printf "\\x$(printf %x $((65 + k)))")"); done
site_list=$(IFS=,; echo "${sites[*]}")

mkdir -p "$out"
out=$(cd "$out" && pwd)
cfg=$out/chaos.ini
cat >"$cfg" <<EOF
; Written by scripts/chaos.sh: the tiny model of tests/cli (2 layers, 32
; wide), $islands islands over loopback TLS with $wan ms one way on every
; link, an outer step every $H steps. faulttol keeps its defaults
; (heartbeat 100 ms, phi 8, pause 1000 ms, timeout 60 s) except
; coordinator_grace_s.
[model]
n_layer = 2
n_head = 2
n_embd = 32
seq_len = 32
vocab_size = 256

[train]
batch_size = 4
steps = $steps
lr = 3e-3
warmup_steps = 10
seed = 1337

[data]
train = data/kjv_train_*.bin
val = data/kjv_val_*.bin

[run]
log_every = 100000
eval_every = $steps
eval_batches = 16
ckpt_every = $(( H * 5 ))
threads = 1
log_level = debug

[outer]
H = $H
optimizer = nesterov
lr = 0.7
momentum = 0.9
sites = $site_list
algorithm = allgather

[compress]
codec = int8
zstd = on

[net]
tls = true
streams = 2
wan_delay_ms = $wan

[faulttol]
; islands wait out a coordinator down this long (chaos restarts it within 5 s)
coordinator_grace_s = 60
EOF
[ ${#sets[@]} -gt 0 ] && printf '; and on the command line: %s\n' "${sets[*]}" >>"$cfg"
certs=$out/certs
if [ ! -f "$certs/ca.pem" ] || [ ! -f "$certs/${sites[islands - 1]}.pem" ]; then
  "$loco" certs --out "$certs" --names "coordinator,$site_list" >/dev/null || exit 1
fi

# A port below the ephemeral range, free now; the coordinator keeps it
# across restarts.
pick_port() {
  local p
  for ((i = 0; i < 200; i++)); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM + $$) % 12000 ))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { PORT=$p; return 0; }
  done
  echo "chaos.sh: no free port" >&2
  return 1
}

# --------------------------------------------------------- the processes
cpid="" watcher=""
pid=() inc=() gone=() est=()
# CPU hogs: busy loops beside the run (--hog), each its own process.
hog_pids=()
start_hog() {
  for ((h = 0; h < hog; h++)); do
    ( trap - EXIT INT TERM; while :; do :; done ) &
    hog_pids+=($!)
  done
}
stop_hog() {
  local p
  for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  hog_pids=()
}

cleanup() {
  for p in $cpid "${pid[@]}"; do
    kill -CONT "$p" 2>/dev/null
    kill -KILL "$p" 2>/dev/null
  done
  [ -n "$watcher" ] && kill "$watcher" 2>/dev/null
  stop_hog
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start_coord() {
  "$loco" coordinator "$cfg" "${common[@]}" --set run.dir="$run" \
    --set net.cert="$certs/coordinator.pem" --set net.key="$certs/coordinator.key" \
    >>"$run/logs/coordinator.log" 2>&1 &
  cpid=$!
}

start_island() { # k [--resume PATH]
  local k=$1 s=${sites[$1]}
  shift
  inc[k]=$(( ${inc[k]:-0} + 1 ))
  LOCO_EVENTS=$events "$loco" island "$cfg" --site "$s" "${common[@]}" --set run.dir="$run/$s" \
    --set net.cert="$certs/$s.pem" --set net.key="$certs/$s.key" "$@" \
    >"$run/logs/$s.${inc[k]}.log" 2>&1 &
  pid[k]=$!
  gone[k]=0
}

# Reaps island k after a kill (its status is the signal's).
reap() { wait "${pid[$1]}" 2>/dev/null; }

# The last commit: C_STEP, C_T (ms), C_N (members), C_HASH; C_COUNT commits.
last_commit() {
  local line
  line=$(grep -a '"kind":"commit"' "$events" 2>/dev/null | tail -n 1)
  C_STEP=0 C_T=0 C_N=0 C_HASH=""
  [ -n "$line" ] || return 0
  [[ $line =~ \"outer_step\":([0-9]+) ]] && C_STEP=${BASH_REMATCH[1]}
  [[ $line =~ \"t\":([0-9]+)\.([0-9]+) ]] && C_T=$(( BASH_REMATCH[1] * 1000 + 10#${BASH_REMATCH[2]} ))
  [[ $line =~ \"hash\":\"([0-9a-f]+)\" ]] && C_HASH=${BASH_REMATCH[1]}
  [[ $line =~ \"members\":\[([^]]*)\] ]] && { local m=${BASH_REMATCH[1]//[^,]/}; C_N=$(( ${#m} + 1 )); }
}

# The finished checkpoints of an island's run dir, oldest first (not the
# DIR.tmp one being written, nor one a killed process left half-written).
ckpts() { ls -d "$1"/ckpt_[0-9]* 2>/dev/null | grep -E '/ckpt_[0-9]+$' | sort; }

# Keeps the newest 4 checkpoints (and outer states) of each island: a long
# run would otherwise fill the disk.
prune() {
  local s d
  for s in "${sites[@]}"; do
    for d in $(ckpts "$run/$s" | head -n -4); do
      rm -rf "$d" "${d/ckpt_/outer_}"
    done
  done
}

# ------------------------------------------------------------ the actions
# Drawn up front from the seed: kind, island, target outer step, delay
# (ms) before it, and the kind's own parameter (restart delay or pause, ms).
A_KIND=() A_SITE=() A_AT=() A_DELAY=() A_PARAM=()
for ((i = 0; i < n_actions; i++)); do
  if [ "$short" = 1 ]; then
    A_KIND[i]=${pool[i % ${#pool[@]}]}
  else
    rnd "${#pool[@]}"
    A_KIND[i]=${pool[R]}
  fi
  rnd "$islands"; A_SITE[i]=$R
  rnd $(( GAP / 2 + 1 )); A_AT[i]=$(( FIRST + i * GAP + R ))
  rnd 2000; A_DELAY[i]=$R
  case ${A_KIND[i]} in
    stop_cont) rnd 4500; A_PARAM[i]=$(( 500 + R )) ;;   # pause 0.5..5 s
    kill_coord) rnd 4500; A_PARAM[i]=$(( 500 + R )) ;;  # down 0.5..5 s
    kill_exchange) rnd 100; A_PARAM[i]=$R ;;             # ms after "ready"
    *) rnd 3000; A_PARAM[i]=$(( 200 + R )) ;;            # restart 0.2..3.2 s
  esac
  if [ "$short" = 1 ]; then
    # Fixed, robust moments: a long enough pause to be suspected.
    A_DELAY[i]=$(( A_DELAY[i] / 4 ))
    [ "${A_KIND[i]}" = stop_cont ] && A_PARAM[i]=2500
    [ "${A_KIND[i]}" = kill_coord ] && A_PARAM[i]=1000
    [ "${A_KIND[i]}" = kill_resume ] && A_PARAM[i]=500
  fi
done

# What the restarted island's log (and, for kill_exchange, the others')
# says happened, appended to $detail: which checkpoint it resumed from,
# whether it fell back, what it fetched, whether the step was redone.
outcome() { # k
  local s=${sites[$1]} lg=$run/logs/${sites[$1]}.${inc[$1]}.log x n
  case ${A_KIND[act]} in
    kill_coord)
      # The new coordinator's part of its log: who registered, where it resumed.
      read -r n x < <(awk '/coordinator: listening on/ { n = 0; r = "" }
        / registered \(/ { n++ } /resuming the run at committed outer step/ { r = $NF }
        END { print n + 0, r }' "$run/logs/coordinator.log")
      detail+="; $n islands registered with the new one${x:+, which resumed at committed outer step $x}" ;;
    stop_cont)
      # A rejoin logged since the SIGSTOP (the count before is in stop_rejoins).
      n=$(grep -ac 'rejoin: .* is a member again' "$lg")
      (( n > stop_rejoins )) && detail+="; rejoined by state transfer" ;;
    *)
      x=$(grep -a -m 1 -o 'using [^ ]*, the newest earlier' "$lg" | sed 's/using \([^ ]*\),.*/\1/')
      [ -n "$x" ] && detail+="; fell back to ${x##*/}"
      x=$(grep -a -m 1 -o 'resumed from [^ ]* at step [0-9]*' "$lg")
      [ -n "$x" ] && detail+="; resumed at step ${x##* }"
      grep -aq 'starts afresh' "$lg" && detail+="; no usable checkpoint: started afresh"
      x=$(grep -a -m 1 -o 'fetched θ_global and momentum of outer step [0-9]*' "$lg")
      [ -n "$x" ] && detail+="; fetched θ of outer step ${x##* } (hash checked)"
      if [ "${A_KIND[act]}" = kill_exchange ]; then
        n=$(grep -a -m 1 -o 'ready for outer step [0-9]*' "$run/logs/exchange_kill.$act" | sed 's/.* //')
        if [ -n "$n" ] && grep -aq "outer step $n: redone" "$run"/logs/site*.log; then
          detail+="; the others redid outer step $n without it"
        elif [ -n "$n" ]; then
          detail+="; outer step $n was not redone (the kill came before or after its exchange)"
        fi
      fi ;;
  esac
}

# Records of what was done, one line per action (tab-separated): index
# kind site t_inject_ms t_resume_ms outer_step_at_injection detail
act_log=""

# One run in directory $run with the first $2 actions; sets RUN_OK,
# RUN_WHY, RUN_WALL_MS, WD_TRIPS, N_DONE, EXIT_ST (per island), C_EXIT.
run_cluster() {
  run=$1
  local nact=$2
  rm -rf "$run"
  mkdir -p "$run/logs"
  events=$run/events.jsonl
  act_log=$run/actions.tsv
  : >"$act_log"
  pick_port || return 1
  common=(--set faulttol.coordinator=127.0.0.1:$PORT --set net.ca="$certs/ca.pem" "${sets[@]}")
  cpid="" pid=() inc=() gone=() est=()
  RUN_OK=1 RUN_WHY="" WD_TRIPS=0 N_DONE=0 C_EXIT=""
  ev "\"kind\":\"start\",\"sites\":[$(printf '"%s",' "${sites[@]}" | sed 's/,$//')],\"config\":\"$cfg\",\"seed\":$seed"
  now_ms; T0=$MS
  start_coord
  for ((k = 0; k < islands; k++)); do start_island "$k"; done
  log "$run: coordinator on 127.0.0.1:$PORT and $islands islands, $steps steps, $nact actions"
  local act=0 phase=idle k=-1 restore_at=0 resume_ms=0 inject_ms=0 fire_at=0 detail=""
  local last_prog=$T0 last_step=-1 finished=0 last_prune=$T0 kind s fired_step=0
  local r_ms=$T0 r_step=0 r_pace=0 stop_rejoins=0
  while :; do
    sleep 0.1
    now_ms
    last_commit
    if [ "$C_STEP" != "$last_step" ]; then last_step=$C_STEP; last_prog=$MS; fi
    if (( MS - r_ms >= 3000 )); then
      r_pace=$(( (C_STEP - r_step) * 1000000 / (MS - r_ms) )) r_ms=$MS r_step=$C_STEP
    fi
    if (( MS - last_prog > watchdog * 1000 )); then
      WD_TRIPS=$(( WD_TRIPS + 1 ))
      RUN_OK=0 RUN_WHY+="watchdog: no outer step committed for $watchdog s (last: outer step $C_STEP); "
      log "WATCHDOG: no outer step committed for $watchdog s"
      break
    fi
    # The coordinator: exits 0 once the run finished; anything else is a failure.
    if [ "$phase" != coord_down ] && ! kill -0 "$cpid" 2>/dev/null; then
      wait "$cpid" 2>/dev/null
      C_EXIT=$?
      if [ "$C_EXIT" = 0 ]; then finished=1; log "coordinator: run finished (outer step $C_STEP)"; break; fi
      RUN_OK=0 RUN_WHY+="the coordinator exited on its own with status $C_EXIT; "
      log "coordinator exited on its own with status $C_EXIT"
      break
    fi
    # Islands: one that exits while no action killed it must exit 0.
    for ((j = 0; j < islands; j++)); do
      [ "${gone[j]}" = 0 ] || continue
      [ "$phase" = down ] && [ "$j" = "$k" ] && continue
      [ "$phase" = armed ] && [ "$j" = "$k" ] && continue
      if ! kill -0 "${pid[j]}" 2>/dev/null; then
        wait "${pid[j]}" 2>/dev/null
        est[j]=$?
        gone[j]=1
        if [ "${est[j]}" != 0 ]; then
          RUN_OK=0 RUN_WHY+="${sites[j]} (incarnation ${inc[j]}) exited on its own with status ${est[j]}; "
          log "${sites[j]} exited on its own with status ${est[j]} (see $run/logs/${sites[j]}.${inc[j]}.log)"
        else
          log "${sites[j]} exited 0"
        fi
      fi
    done
    [ "$RUN_OK" = 1 ] || break
    if (( MS - last_prune > 5000 )) && [ "$phase" = idle ]; then prune; last_prune=$MS; fi
    case $phase in
      idle)
        (( act < nact )) || continue
        if (( C_STEP >= stop_at )); then
          log "actions $act..$(( nact - 1 )) skipped: the run is ending (outer step $C_STEP of $outer_total)"
          act=$nact
          continue
        fi
        (( C_STEP >= A_AT[act] )) || continue
        if (( fire_at == 0 )); then fire_at=$(( MS + A_DELAY[act] )); continue; fi
        (( MS >= fire_at )) || continue
        fire_at=0
        # Time left at the faster of the run's pace so far and its recent
        # pace (outer steps per 1000 s), against what the action needs.
        local pace=$(( C_STEP * 1000000 / (MS - T0 + 1) )) left need=$(( A_PARAM[act] + 3000 ))
        (( r_pace > pace )) && pace=$r_pace
        left=$(( (outer_total - C_STEP) * 1000000 / (pace + 1) ))
        if (( left < need )); then
          log "actions $act..$(( nact - 1 )) skipped: the run ends in about $(secs "$left") s, action $act needs about $(secs "$need") s"
          act=$nact
          continue
        fi
        kind=${A_KIND[act]} k=${A_SITE[act]} s=${sites[k]}
        [ "$kind" = kill_coord ] && s=coordinator
        now_ms; inject_ms=$MS detail="" fired_step=$C_STEP
        case $kind in
          kill_coord)
            kill -KILL "$cpid"; wait "$cpid" 2>/dev/null
            ev "\"kind\":\"fault\",\"fault\":\"kill_coordinator\",\"site\":\"coordinator\",\"detail\":\"chaos $act: $kind\""
            restore_at=$(( MS + A_PARAM[act] )) phase=coord_down
            detail="down $(secs "${A_PARAM[act]}") s" ;;
          stop_cont)
            stop_rejoins=$(grep -ac 'rejoin: .* is a member again' "$run/logs/$s.${inc[k]}.log")
            kill -STOP "${pid[k]}"
            ev "\"kind\":\"fault\",\"fault\":\"freeze\",\"site\":\"$s\",\"detail\":\"chaos $act: SIGSTOP for $(secs "${A_PARAM[act]}") s\""
            restore_at=$(( MS + A_PARAM[act] )) phase=stopped
            detail="stopped $(secs "${A_PARAM[act]}") s" ;;
          kill_exchange)
            local lg=$run/logs/$s.${inc[k]}.log p=${pid[k]} d
            d=$(secs "${A_PARAM[act]}")
            # Kills the island d s after its next "ready for outer step"
            # (or after 30 s without one) and records the moment.
            ( l=$(timeout 30 tail -n 0 -F "$lg" 2>/dev/null | grep -a -m 1 -o 'ready for outer step [0-9]*')
              sleep "$d"
              kill -KILL "$p" 2>/dev/null
              t=$EPOCHREALTIME
              ev "\"kind\":\"fault\",\"fault\":\"kill\",\"site\":\"$s\",\"detail\":\"chaos $act: $kind, $d s after '${l:-no outer step within 30 s}'\""
              echo "${t/./} ${l:-no outer step within 30 s}" >"$run/logs/exchange_kill.$act"
            ) >/dev/null 2>&1 &
            watcher=$!
            phase=armed ;;
          *)
            kill -KILL "${pid[k]}"; reap "$k"
            ev "\"kind\":\"fault\",\"fault\":\"kill\",\"site\":\"$s\",\"detail\":\"chaos $act: $kind\""
            restore_at=$(( MS + A_PARAM[act] )) phase=down ;;
        esac
        log "action $act: $kind $s${detail:+ ($detail)} at outer step $C_STEP"
        ;;
      armed)
        if ! kill -0 "${pid[k]}" 2>/dev/null; then
          reap "$k"; wait "$watcher" 2>/dev/null; watcher=""
          local us line
          read -r us line <"$run/logs/exchange_kill.$act"
          inject_ms=$(( 10#$us / 1000 ))
          detail="$(secs "${A_PARAM[act]}") s after '$line'"
          restore_at=$(( MS + 500 )) phase=down
          log "action $act: ${A_KIND[act]} $s killed $detail"
        fi ;;
      down)
        (( MS >= restore_at )) || continue
        local how=()
        case ${A_KIND[act]} in
          kill_fresh) detail+="${detail:+; }restarted without --resume" ;;
          kill_ckpt)
            local older
            older=$(ckpts "$run/$s" | tail -n 2 | head -n 1)
            if [ -n "$older" ]; then how=(--resume "$older"); detail+="${detail:+; }--resume ${older##*/}"
            else detail+="${detail:+; }no checkpoint yet: restarted without --resume"; fi ;;
          kill_corrupt)
            local newest f
            newest=$(ckpts "$run/$s" | tail -n 1)
            if [ -n "$newest" ]; then
              f=$newest/model.safetensors
              truncate -s $(( $(stat -c %s "$f") / 2 )) "$f"
              detail+="${detail:+; }${newest##*/}/model.safetensors cut in half"
            else
              detail+="${detail:+; }no checkpoint to corrupt"
            fi
            how=(--resume "$run/$s") ;;
          *) how=(--resume "$run/$s"); detail+="${detail:+; }--resume run dir" ;;
        esac
        start_island "$k" "${how[@]}"
        now_ms; resume_ms=$MS
        ev "\"kind\":\"fault\",\"fault\":\"restart\",\"site\":\"$s\",\"detail\":\"chaos $act: ${detail//\"/}\""
        log "action $act: $s restarted ($detail)"
        phase=recover ;;
      stopped)
        (( MS >= restore_at )) || continue
        kill -CONT "${pid[k]}"
        ev "\"kind\":\"fault\",\"fault\":\"thaw\",\"site\":\"$s\",\"detail\":\"chaos $act: SIGCONT\""
        now_ms; resume_ms=$MS phase=recover
        log "action $act: $s continued" ;;
      coord_down)
        (( MS >= restore_at )) || continue
        start_coord
        now_ms; resume_ms=$MS phase=recover
        ev "\"kind\":\"fault\",\"fault\":\"restart_coordinator\",\"site\":\"coordinator\",\"detail\":\"chaos $act\""
        log "action $act: coordinator restarted" ;;
      recover)
        # Recovered: an outer step committed by every island after it.
        if (( C_N == islands && C_T >= resume_ms )); then
          outcome "$k"
          printf '%d\t%s\t%s\t%d\t%d\t%d\t%s\n' "$act" "${A_KIND[act]}" "$s" "$inject_ms" "$resume_ms" \
            "$fired_step" "$detail" >>"$act_log"
          log "action $act: recovered (outer step $C_STEP committed by all $islands islands)"
          act=$(( act + 1 )) N_DONE=$act phase=idle
        fi ;;
    esac
  done
  # An action still in progress at the end is recorded as it stands.
  if [ "$phase" != idle ] && [ "$phase" != armed ]; then
    printf '%d\t%s\t%s\t%d\t%d\t%d\t%s\n' "$act" "${A_KIND[act]}" "$s" "$inject_ms" "$resume_ms" \
      "$fired_step" "$detail; not recovered when the run ended" >>"$act_log"
    [ "$finished" = 1 ] && { RUN_OK=0; RUN_WHY+="the run ended while action $act (${A_KIND[act]}) was not recovered; "; }
  fi
  # Every island's last process must exit 0 by itself, soon after the end.
  local deadline=$(( MS + 60000 ))
  for ((j = 0; j < islands; j++)); do
    [ "${gone[j]}" = 0 ] || continue
    kill -CONT "${pid[j]}" 2>/dev/null
    while kill -0 "${pid[j]}" 2>/dev/null; do
      now_ms
      if [ "$finished" != 1 ] || (( MS > deadline )); then
        kill -KILL "${pid[j]}" 2>/dev/null
        RUN_OK=0 RUN_WHY+="${sites[j]} still running $([ "$finished" = 1 ] && echo "60 s after the end" || echo "when the run stopped"): killed; "
        break
      fi
      sleep 0.2
    done
    wait "${pid[j]}" 2>/dev/null
    est[j]=$?
    gone[j]=1
    if [ "${est[j]}" != 0 ] && [[ $RUN_WHY != *"${sites[j]} still running"* ]]; then
      RUN_OK=0 RUN_WHY+="${sites[j]} (incarnation ${inc[j]}) exited with status ${est[j]}; "
    fi
  done
  if [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null; then
    kill -KILL "$cpid"; wait "$cpid" 2>/dev/null; C_EXIT=killed
  fi
  [ "$finished" = 1 ] || { RUN_OK=0; [ -n "$RUN_WHY" ] || RUN_WHY="the run did not finish; "; }
  (( N_DONE < nact )) && { RUN_OK=0; RUN_WHY+="$(( nact - N_DONE )) of $nact actions not done; "; }
  now_ms
  RUN_WALL_MS=$(( MS - T0 ))
  cpid="" pid=()
}

# -------------------------------------------------------------- analysis
# Each island's last outer.jsonl record: "SITE STEP HASH".
last_outer() {
  local s line st h
  for s in "${sites[@]}"; do
    line=$(grep -a '"theta_hash"' "$1/$s/outer.jsonl" 2>/dev/null | tail -n 1)
    st=-1 h=none
    [[ $line =~ \"outer_step\":([0-9]+) ]] && st=${BASH_REMATCH[1]}
    [[ $line =~ \"theta_hash\":\"([0-9a-f]+)\" ]] && h=${BASH_REMATCH[1]}
    echo "$s $st $h"
  done
}

# Mean over islands of the last validation loss (the final θ_global).
final_loss() {
  local s
  for s in "${sites[@]}"; do grep -a '"val_loss"' "$1/$s/metrics.jsonl" 2>/dev/null | tail -n 1; done |
    sed -n 's/.*"val_loss":\([-0-9.e+]*\).*/\1/p' |
    awk '{ s += $1; n++ } END { if (n) printf "%.4f", s / n; else printf "none" }'
}

# Per action: detection (first suspicion of its island at or after the
# injection; none for the coordinator) and recovery (first commit by all
# islands at or after the restart / SIGCONT), both in seconds from the
# injection; then the suspicions no action explains. Prints table rows,
# then "#stats" lines.
analyse() { # run_dir
  awk -v K="$islands" -v T0="$(grep -a -m 1 '"kind":"start"' "$1/events.jsonl" | sed 's/^{"t":\([0-9.]*\).*/\1/')" '
    function num(line, key,   m) { if (match(line, "\"" key "\":[-0-9.e]+")) { m = substr(line, RSTART, RLENGTH); sub(/^"[^"]*":/, "", m); return m + 0 } return -1 }
    function str(line, key,   m) { if (match(line, "\"" key "\":\"[^\"]*\"")) { m = substr(line, RSTART, RLENGTH); sub(/^"[^"]*":"/, "", m); sub(/"$/, "", m); return m } return "" }
    function nmem(line,   m, c) { if (!match(line, /"members":\[[^]]*\]/)) return 0; m = substr(line, RSTART, RLENGTH); c = gsub(/,/, ",", m); return c + 1 }
    function sort(a, n,   i, j, t) { for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
    function med(a, n) { sort(a, n); return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    FILENAME == ARGV[1] { # actions.tsv
      split($0, f, "\t"); na++; idx[na] = f[1]; kind[na] = f[2]; site[na] = f[3]
      tin[na] = f[4] / 1000; tres[na] = f[5] / 1000; ostep[na] = f[6]; det[na] = f[7]; next
    }
    { ne++; ev[ne] = $0; et[ne] = num($0, "t"); ek[ne] = str($0, "kind") }
    END {
      nd = 0; nr = 0; unexpl = 0; nsus = 0
      for (a = 1; a <= na; a++) {
        d = -1; r = -1; sreason = ""; join = -1
        for (e = 1; e <= ne; e++) {
          if (et[e] < tin[a]) continue
          if (d < 0 && ek[e] == "suspect" && str(ev[e], "site") == site[a]) { d = et[e] - tin[a]; sreason = str(ev[e], "reason"); sus_act[e] = 1 }
          if (join < 0 && ek[e] == "join" && str(ev[e], "site") == site[a]) join = et[e] - tin[a]
          if (r < 0 && ek[e] == "commit" && et[e] >= tres[a] && nmem(ev[e]) == K) r = et[e] - tin[a]
        }
        # Suspicions of the acted-on island between injection and recovery
        # are its own; so are any suspicions while the coordinator restarts.
        for (e = 1; e <= ne; e++)
          if (ek[e] == "suspect" && et[e] >= tin[a] && (r < 0 || et[e] <= tin[a] + r) && (str(ev[e], "site") == site[a] || kind[a] == "kill_coord")) sus_act[e] = 1
        note = det[a]
        if (sreason != "") note = note "; suspected: " sreason
        if (join >= 0) note = note sprintf("; joined at +%.2f s", join)
        if (d < 0 && site[a] != "coordinator") note = note "; not suspected"
        printf "| %d | %.1f | %d | %s | %s | %s | %s | %s |\n", idx[a], tin[a] - T0, ostep[a], kind[a], site[a], d < 0 ? "—" : sprintf("%.2f", d), r < 0 ? "—" : sprintf("%.2f", r), note
        if (d >= 0) D[++nd] = d
        if (r >= 0) Rc[++nr] = r
      }
      for (e = 1; e <= ne; e++) if (ek[e] == "suspect") { nsus++; if (!sus_act[e]) { unexpl++; ulist = ulist sprintf(" %s at %.1f s (%s);", str(ev[e], "site"), et[e] - T0, str(ev[e], "reason")) } }
      printf "#stats detect_n=%d detect_med=%s detect_max=%s\n", nd, nd ? sprintf("%.2f", med(D, nd)) : "—", nd ? sprintf("%.2f", D[nd]) : "—"
      printf "#stats recover_n=%d recover_med=%s recover_max=%s\n", nr, nr ? sprintf("%.2f", med(Rc, nr)) : "—", nr ? sprintf("%.2f", Rc[nr]) : "—"
      printf "#stats suspicions=%d unexplained=%d\n", nsus, unexpl
      printf "#unexplained%s\n", ulist
    }' "$1/actions.tsv" "$1/events.jsonl"
}

# ------------------------------------------------------------------ main
base_dir="" base_note=""
if [ "$no_baseline" = 0 ]; then
  base_dir=${baseline:-$out/baseline}
  if [ -f "$base_dir/events.jsonl" ] && grep -aq '"kind":"end","status":"finished"' "$base_dir/events.jsonl"; then
    if [ -f "$base_dir/chaos.ini" ] && ! diff -q <(grep -v '^dir' "$base_dir/chaos.ini") <(grep -v '^dir' "$cfg") >/dev/null; then
      echo "chaos.sh: $base_dir was run with another config (see its chaos.ini)" >&2
      exit 2
    fi
    base_note="reused $base_dir"
    echo "chaos: reusing the fault-free run in $base_dir"
  elif [ -n "$baseline" ]; then
    echo "chaos.sh: --baseline $baseline: not a finished run" >&2
    exit 2
  else
    echo "chaos: fault-free run of the same config first, in $base_dir"
    run_cluster "$base_dir" 0 2>>"$out/shell.log"
    cp "$cfg" "$base_dir/chaos.ini"
    base_note="run first, in $base_dir ($(secs "$RUN_WALL_MS") s)"
    if [ "$RUN_OK" != 1 ]; then
      echo "chaos: the fault-free run failed: $RUN_WHY" >&2
      base_note+="; FAILED: $RUN_WHY"
    fi
  fi
fi

echo "chaos: seed $seed, $islands islands, $n_actions actions, $steps steps (outer step every $H), watchdog $watchdog s, in $out/run"
# Bash's own notices (an island killed by the exchange watcher reads as
# "Killed") go to OUT/shell.log, not among the progress lines.
[ "$hog" -gt 0 ] && echo "chaos: $hog CPU hogs beside the run ($(nproc) cores)"
start_hog
run_cluster "$out/run" "$n_actions" 2>>"$out/shell.log"
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
stop_hog
cp "$cfg" "$out/run/chaos.ini"

# Hashes: every island at the same outer step with the same θ_global, the
# coordinator's last commit included.
last_commit
hashes=$(last_outer "$out/run")
agree=yes
while read -r s st h; do
  { [ "$st" = "$C_STEP" ] && [ "$h" = "$C_HASH" ]; } || agree=no
done <<<"$hashes"
[ "$C_STEP" = "$outer_total" ] || agree=no
[ "$agree" = yes ] || { RUN_OK=0; RUN_WHY+="θ_global hashes differ or not at the last outer step; "; }
# A committed outer step is final: one hash per step on the whole timeline
# (a restarted coordinator that finishes a commit the timeline lacks writes it).
twice=$(grep -a '"kind":"commit"' "$out/run/events.jsonl" |
  sed -n 's/.*"outer_step":\([0-9]*\),.*"hash":"\([0-9a-f]*\)".*/\1 \2/p' | sort -u |
  awk '{ n[$1]++ } END { for (s in n) if (n[s] > 1) printf "%s ", s }')
[ -z "$twice" ] || { RUN_OK=0; RUN_WHY+="outer steps committed with two hashes: ${twice% }; "; }
exits=""
all0=yes
for ((j = 0; j < islands; j++)); do
  exits+="${sites[j]} ${est[j]:-?} (process ${inc[j]:-0}), "
  [ "${est[j]:-x}" = 0 ] || all0=no
done
loss=$(final_loss "$out/run")
bloss=none rel="—"
if [ -n "$base_dir" ] && [ -d "$base_dir" ]; then
  bloss=$(final_loss "$base_dir")
  bsus=$(grep -ac '"kind":"suspect"' "$base_dir/events.jsonl")
fi
if [ "$loss" != none ] && [ "$bloss" != none ]; then
  rel=$(awk -v a="$loss" -v b="$bloss" 'BEGIN { printf "%+.2f%%", (a - b) / (b < 0 ? -b : b) * 100 }')
fi
stats=$(analyse "$out/run")
verdict="not written (no fault-free run)"
if [ -n "$base_dir" ] && [ -d "$base_dir" ]; then
  verdict=$("$loco" report "$out/run" "$base_dir" --out "$out/run" 2>&1 | grep -a -i 'verdict' | tail -n 1)
  verdict=${verdict:-"loco report failed (see $out/run)"}
fi
stat_of() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$stats" | head -n 1; }

summary=$out/summary.md
{
  echo "# Chaos run: seed $seed, $islands islands, $n_actions actions"
  echo
  echo "\`$cmdline\` (loco: \`$loco\`), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
  echo "Config: $out/run/chaos.ini ($steps steps, an outer step every $H, $outer_total outer steps, default faulttol except coordinator_grace_s = 60)."
  echo
  echo "Times in seconds: *at* from the start of the run, *detected* (first suspicion of the island)"
  echo "and *recovered* (first outer step committed by all $islands islands after the restart or SIGCONT) from the action."
  echo
  echo "| # | at | outer step | action | site | detected | recovered | notes |"
  echo "|---|---|---|---|---|---|---|---|"
  grep -v '^#' <<<"$stats"
  echo
  echo "## Result"
  echo
  echo "- result: $([ "$RUN_OK" = 1 ] && echo PASS || echo "FAIL: ${RUN_WHY%; }")"
  echo "- actions performed: $N_DONE of $n_actions"
  echo "- every island's last process exited 0: $all0 (${exits%, })"
  echo "- coordinator exited 0: $([ "$C_EXIT" = 0 ] && echo yes || echo "no ($C_EXIT)")"
  echo "- θ_global hashes agree: $agree (last commit: outer step $C_STEP of $outer_total, $C_HASH; islands: $(tr '\n' ';' <<<"$hashes" | sed 's/;$//; s/;/, /g'))"
  echo "- final loss (validation, mean over islands): $loss; fault-free: $bloss; difference: $rel"
  echo "- detection: median $(stat_of detect_med) s, max $(stat_of detect_max) s ($(stat_of detect_n) actions suspected)"
  echo "- recovery: median $(stat_of recover_med) s, max $(stat_of recover_max) s ($(stat_of recover_n) actions)"
  echo "- suspicions: $(stat_of suspicions), of which not explained by an action: $(stat_of unexplained)$(sed -n 's/^#unexplained\(..*\)/ (\1)/p' <<<"$stats")"
  [ -n "$base_dir" ] && echo "- fault-free run: $base_note; suspicions there: ${bsus:-?}"
  echo "- outer steps committed with two hashes: ${twice:-none}"
  echo "- CPU hogs beside the run: $hog (load average at its end: $load_end)"
  echo "- watchdog trips: $WD_TRIPS (limit $watchdog s without a commit)"
  echo "- wall time of the chaos run: $(secs "$RUN_WALL_MS") s"
  echo "- loco report: ${verdict} ($out/run/report.md)"
} >"$summary"
cat "$summary"
[ "$RUN_OK" = 1 ] && exit 0 || exit 1
