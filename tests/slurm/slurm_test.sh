#!/usr/bin/env bash
# Slurm, for real (issue 14): starts a private one-node Slurm cluster (munged, slurmctld and slurmd
# from Debian's `munge` and `slurm-wlm`, on free ports, everything under a scratch folder) and
# drives the `tandem` binary with it, training the tiny model on the production engine's cpu backend:
#   1. `srun --mpi=pmix -n 2` trains and writes, byte for byte, the checkpoint `mpirun -np 2` writes
#      (a run is bitwise reproducible for one layout, whichever launcher started its ranks);
#   2. `srun --mpi=pmix -n 4 --overcommit` (4 ranks on 2 cores) likewise equals `mpirun -np 4`;
#   3. an `sbatch --requeue --time=1 --signal=TERM@56` job (tests/slurm/requeue_job.sh): Slurm's
#      time-limit warning reaches the ranks, --exit-signal-handler saves a checkpoint and exits 0,
#      the job requeues itself and its next start resumes with --load; its final checkpoint equals,
#      byte for byte, a straight run's to the same iteration, and not the one it resumed from.
# Kind of check: exact (the checkpoints' tensor files compared with cmp; iterations, exit statuses,
# the job's state and restart count; the log lines that show the signal and the resume).
# About 50 s on 2 cores, most of it waiting for slurmctld's 30 s time-limit check (step 3).
# Usage: tests/slurm/slurm_test.sh TANDEM_BINARY   (TANDEM_SLURM_KEEP=1 keeps the scratch folder)
# As root (CI's machines run as root; the daemons' SlurmUser is the user who starts them). Exit 0
# when every check holds; 1 naming the failed check, with the daemons' logs and the runs' output.
# The daemons are stopped by their pid files on every exit, and by a guard if the script is killed.
set -euo pipefail

tandem_log() { printf '[%s] slurm_test: %s\n' "$(date +%H:%M:%S)" "$*"; }
fail() {
  printf 'FAIL: %s\n' "$*" >&2
  exit 1
}

[ $# -eq 1 ] || fail "usage: $0 TANDEM_BINARY"
tandem="$(realpath "$1")"
[ -x "$tandem" ] || fail "$1 is not an executable tandem binary"
for tool in munged mungekey slurmctld slurmd srun sbatch scontrol squeue sinfo scancel mpirun python3; do
  command -v "$tool" >/dev/null 2>&1 ||
    fail "$tool not found: install slurm-wlm munge (ci/lib.sh's TANDEM_PACKAGES lists them)"
done
[ "$(id -u)" -eq 0 ] || fail "run as root: the private cluster's daemons and jobs run as the user starting them"
# Run inside an outer Slurm job, its SLURM_* (and sbatch's and srun's input) variables would send
# our srun into that job's allocation: the private cluster starts from none.
for variable in $(compgen -v SLURM_) $(compgen -v SBATCH_) $(compgen -v SRUN_) $(compgen -v SALLOC_); do
  unset "$variable"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI under srun does not know that 4 ranks share 2 cores, and its busy polling then makes
# each collective wait for a time slice (22 s instead of 3 s for the 4-rank run); yielding when
# idle is what mpirun --oversubscribe turns on. It changes no arithmetic.
export OMPI_MCA_mpi_yield_when_idle=1

# munged insists that every folder above its socket is searchable by everyone.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/tandem-slurm.XXXXXX")"
chmod 755 "$scratch"
mkdir -m 755 "$scratch/munge"
mkdir "$scratch/state" "$scratch/spool" "$scratch/tmp" "$scratch/log" "$scratch/runs"
export SLURM_CONF="$scratch/slurm.conf"

# stop_cluster_in SCRATCH: cancels the private cluster's jobs, then stops slurmd, slurmctld and
# munged by the pid files in SCRATCH (SIGTERM; SIGKILL after 10 s). Touches nothing else.
stop_cluster_in() {
  local scratch="$1"
  if [ -f "$scratch/slurmctld.pid" ]; then
    SLURM_CONF="$scratch/slurm.conf" scancel --quiet --user="$(id -un)" 2>/dev/null
    for _ in $(seq 1 20); do
      [ -z "$(SLURM_CONF="$scratch/slurm.conf" squeue --noheader 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for daemon in slurmd slurmctld munge/munged; do
    [ -f "$scratch/$daemon.pid" ] || continue
    local pid
    pid="$(cat "$scratch/$daemon.pid")"
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      echo "slurm_test: $daemon (pid $pid) ignored SIGTERM for 10 s: SIGKILL" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  done
}

# A script killed outright (SIGKILL: ctest's timeout) runs no trap, and the daemons would outlive
# it. A guard waits for this script to end and then stops them; it runs in a session of its own
# and is orphaned at once (the subshell around it exits), because ctest's timeout kills the test's
# whole process tree. It leaves its pid in SCRATCH/guard.pid for the normal exit to end it.
# shellcheck disable=SC2016  # $1, $2 and $3 are the guard's own arguments
(setsid bash -c "$(declare -f stop_cluster_in)"'
  echo "$$" >"$2/guard.pid"
  while kill -0 "$1" 2>/dev/null; do sleep 1; done
  stop_cluster_in "$2"
  [ "$3" = 1 ] || rm -rf "$2"' slurm_test_guard "$$" "$scratch" "${TANDEM_SLURM_KEEP:-0}" \
  </dev/null >/dev/null 2>&1 &)

# On every exit: the logs when the test failed, then the cluster stopped and the scratch removed.
finish() {
  local status=$?
  trap - EXIT
  set +e
  [ -f "$scratch/guard.pid" ] && kill "$(cat "$scratch/guard.pid")" 2>/dev/null
  if [ "$status" -ne 0 ]; then
    for log in "$scratch"/log/*.log "$scratch"/runs/*.out; do
      [ -f "$log" ] && { printf -- '---- %s (last 40 lines)\n' "$log"; tail -n 40 "$log"; } >&2
    done
  fi
  stop_cluster_in "$scratch"
  if [ "${TANDEM_SLURM_KEEP:-0}" = 1 ]; then
    echo "slurm_test: kept $scratch" >&2
  else
    [ "$status" -eq 0 ] || echo "slurm_test: removing $scratch (TANDEM_SLURM_KEEP=1 keeps it)" >&2
    rm -rf "$scratch"
  fi
  exit "$status"
}
trap finish EXIT
trap 'fail "line $LINENO: \"$BASH_COMMAND\" exited $?"' ERR
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the cluster ----------------------------------------------------------------------------------
# Two ports free now (the kernel's pick), so that the test never meets a system Slurm's 6817/6818.
read -r slurmctld_port slurmd_port < <(python3 -c '
import socket
sockets = [socket.socket() for _ in range(2)]
for s in sockets:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in sockets))')
node="$(hostname -s)"
cores="$(nproc)"

mungekey --create --keyfile="$scratch/munge/munge.key"
munged --socket="$scratch/munge/socket" --key-file="$scratch/munge/munge.key" \
  --pid-file="$scratch/munge/munged.pid" --log-file="$scratch/log/munged.log" \
  --seed-file="$scratch/munge/munged.seed" ||
  fail "munged did not start (its log: $scratch/log/munged.log)"

# AuthInfo: our munged's socket; cred_expire=5 is also how long a requeued job waits before it may
# start again (the default, 120 s, would be most of the test). SlurmctldDebug=debug2 logs each
# time-limit check (see the sbatch step).
cat >"$SLURM_CONF" <<EOF
ClusterName=tandemci
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$slurmctld_port
SlurmdPort=$slurmd_port
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$scratch/munge/socket,cred_expire=5
StateSaveLocation=$scratch/state
SlurmdSpoolDir=$scratch/spool
TmpFS=$scratch/tmp
SlurmctldPidFile=$scratch/slurmctld.pid
SlurmdPidFile=$scratch/slurmd.pid
SlurmctldLogFile=$scratch/log/slurmctld.log
SlurmdLogFile=$scratch/log/slurmd.log
SlurmctldDebug=debug2
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SwitchType=switch/none
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
MinJobAge=600
KillWait=5
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cores State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

slurmctld || fail "slurmctld did not start"
slurmd || fail "slurmd did not start"
for _ in $(seq 1 60); do
  [ "$(sinfo --noheader --format=%t 2>/dev/null)" = idle ] && break
  sleep 0.5
done
[ "$(sinfo --noheader --format=%t 2>/dev/null)" = idle ] ||
  fail "the node $node is not idle 30 s after slurmd started: $(sinfo --noheader --format='%t %E' 2>&1)"
srun --mpi=list 2>&1 | grep -q pmix || fail "srun offers no pmix: $(srun --mpi=list 2>&1)"
tandem_log "cluster up: node $node, $cores CPUs, slurmctld port $slurmctld_port, slurmd port $slurmd_port"

# --- the runs ---------------------------------------------------------------------------------------
# The tiny model of tests/support/tiny_train_cli.hpp on the production engine's cpu backend.
runs="$scratch/runs"
tiny=(train --engine production --device cpu --num-layers 2 --hidden-size 32 --num-attention-heads 4
  --group-query-attention --num-query-groups 2 --seq-length 32 --micro-batch-size 2
  --lr 3e-3 --min-lr 3e-4 --lr-warmup-samples 8 --lr-decay-style cosine --clip-grad 1.0
  --weight-decay 0.1 --attention-dropout 0.0 --hidden-dropout 0.0 --data-cache "$scratch/data" --quiet)

run_limit=60  # seconds for any one launch (each takes 2-6 s): a hang fails the test, not ctest
tracker_of() { cat "$1/latest_checkpointed_iteration.txt" 2>/dev/null || echo none; }
iteration_dir() { printf '%s/iter_%07d' "$1" "$2"; }

# expect_same_tensors A B ITERATION WHAT: every .safetensors file of A's checkpoint at ITERATION
# equals B's byte for byte, and there are as many in each.
expect_same_tensors() {
  local a b
  a="$(iteration_dir "$1" "$3")"
  b="$(iteration_dir "$2" "$3")"
  local a_files b_files
  a_files="$(cd "$a" && ls -- *.safetensors)" || fail "$4: no checkpoint $a"
  b_files="$(cd "$b" && ls -- *.safetensors)" || fail "$4: no checkpoint $b"
  [ "$a_files" = "$b_files" ] || fail "$4: $a holds [$a_files], $b holds [$b_files]"
  for file in $a_files; do
    cmp "$a/$file" "$b/$file" >&2 || fail "$4: $file differs ($a vs $b)"
  done
  tandem_log "ok: $4 ($(wc -w <<<"$a_files") tensor files identical at iteration $3)"
}

# train_with NAME ITERATIONS GLOBAL_BATCH LAUNCHER...: the tiny model for ITERATIONS updates of
# GLOBAL_BATCH samples under LAUNCHER into runs/NAME; exit 0 and the tracker at ITERATIONS, or fail.
train_with() {
  local name="$1" iterations="$2" global_batch="$3"
  shift 3
  timeout "$run_limit" "$@" "$tandem" "${tiny[@]}" --global-batch-size "$global_batch" \
    --train-samples "$((iterations * global_batch))" --save "$runs/$name" >"$runs/$name.out" 2>&1 ||
    fail "$name: '$* tandem train ...' exited $? (its output: $runs/$name.out)"
  [ "$(tracker_of "$runs/$name")" = "$iterations" ] ||
    fail "$name: the tracker says $(tracker_of "$runs/$name"), not $iterations"
}

tandem_log "srun --mpi=pmix -n 2 trains 40 iterations, as mpirun -np 2 does"
train_with srun-2 40 4 srun --mpi=pmix --ntasks=2
train_with mpirun-2 40 4 mpirun -np 2 --oversubscribe
expect_same_tensors "$runs/srun-2" "$runs/mpirun-2" 40 "srun -n 2 wrote mpirun -np 2's checkpoint"

# Global batch 8: one microbatch of 2 samples on each of the 4 data-parallel ranks.
tandem_log "srun --mpi=pmix -n 4 --overcommit ($cores CPUs) trains 20 iterations, as mpirun -np 4 does"
train_with srun-4 20 8 srun --mpi=pmix --ntasks=4 --overcommit
train_with mpirun-4 20 8 mpirun -np 4 --oversubscribe
expect_same_tensors "$runs/srun-4" "$runs/mpirun-4" 20 "srun -n 4 wrote mpirun -np 4's checkpoint"

# --- sbatch --requeue --signal=TERM@N ---------------------------------------------------------------
# slurmctld checks time limits every 30 s from its start (SlurmctldDebug=debug2 logs each check)
# and sends --signal=SIG@N's warning at the first check that finds N seconds or fewer left. The job
# asks for --time=1 and --signal=TERM@56: the warning falls due 4 s after it starts. Submitted 6 s
# before a check, its ranks have started training when that check signals them, a few seconds in
# rather than up to 30 s in (each second of training before the signal is trained twice: by the
# job and by the straight run). A late check costs time, not the verdict: the job's first start
# trains until the signal comes, however late.
submit_lead=6
warn_seconds=56
time_limit_check='debug2: Testing job time limits\|slurmctld version .* started on cluster'
checks_from="$(sed -n "s/^\[\([^]]*\)\] \($time_limit_check\).*/\1/p" "$scratch/log/slurmctld.log" | tail -n 1)"
[ -n "$checks_from" ] || fail "slurmctld's log shows neither its start nor a time-limit check"
wait_seconds="$(awk -v now="$(date +%s.%N)" -v from="$(date -d "$checks_from" +%s.%N)" \
  -v lead="$submit_lead" 'BEGIN {
    check = from; while (check < now + lead) check += 30
    printf "%.3f\n", check - lead - now }')"
tandem_log "waiting $wait_seconds s to submit the job $submit_lead s before slurmctld's next time-limit check"
sleep "$wait_seconds"
endless_samples=400000  # 100,000 iterations of 4: minutes of training, never reached in the test
more_iterations=50
save="$runs/requeued"
job_id="$(sbatch --parsable --job-name=tandem-requeue --ntasks=2 --time=1 --signal="TERM@$warn_seconds" \
  --requeue --open-mode=append --output="$runs/requeued.out" \
  "$(dirname "$(realpath "$0")")/requeue_job.sh" "$save" "$more_iterations" \
  "$tandem" "${tiny[@]}" --global-batch-size 4 --train-samples "$endless_samples")" ||
  fail "sbatch refused the job"
tandem_log "sbatch --requeue --time=1 --signal=TERM@$warn_seconds: job $job_id"

job_field() { { scontrol show job "$job_id" --oneliner 2>/dev/null || true; } | tr ' ' '\n' | sed -n "s/^$1=//p"; }
deadline=$((SECONDS + 150))
while :; do
  state="$(job_field JobState)"
  case "$state" in
    COMPLETED) break ;;
    FAILED | TIMEOUT | CANCELLED | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE)
      fail "job $job_id ended $state ($(job_field Reason)); its output: $runs/requeued.out" ;;
  esac
  ((SECONDS < deadline)) || fail "job $job_id is still $state after 150 s"
  sleep 0.5
done
restarts="$(job_field Restarts)"
tandem_log "job $job_id COMPLETED after $restarts requeue(s)"
((restarts >= 1)) || fail "job $job_id completed without being requeued: the signal never stopped it"
target="$(cat "$save.target")"
stopped_at="$(sed -n 's/^requeue_job: tandem exited 0 at iteration \([0-9]*\) .*/\1/p' "$runs/requeued.out" |
  head -n 1)"
[ -n "$stopped_at" ] || fail "the job's first start did not exit 0 with a checkpoint: $runs/requeued.out"
((stopped_at > 0 && stopped_at < target)) ||
  fail "the first start stopped at iteration $stopped_at, not before the target $target"
grep -q "send_job_warn_signal: warning signal 15 to JobId=$job_id\$" "$scratch/log/slurmctld.log" ||
  fail "slurmctld's log shows no --signal warning (SIGTERM) sent to job $job_id"
[ -d "$(iteration_dir "$save" "$stopped_at")" ] ||
  fail "no checkpoint at iteration $stopped_at, where the signal stopped the run"
grep -q "SIGTERM received (--exit-signal-handler); checkpoint saved" "$runs/requeued.out" ||
  fail "the job's output does not show the ranks receiving SIGTERM: $runs/requeued.out"
grep -q "resumed from $save at iteration $stopped_at" "$runs/requeued.out" ||
  fail "the requeued job did not resume from iteration $stopped_at: $runs/requeued.out"
[ "$(tracker_of "$save")" = "$target" ] ||
  fail "the requeued job ended at iteration $(tracker_of "$save"), not $target"
tandem_log "ok: Slurm's SIGTERM stopped the ranks at iteration $stopped_at with a checkpoint;" \
  "the requeued job resumed there and ended at $target"

timeout "$run_limit" srun --mpi=pmix --ntasks=2 "$tandem" "${tiny[@]}" --global-batch-size 4 \
  --train-samples "$endless_samples" --exit-interval "$target" --save "$runs/straight" \
  >"$runs/straight.out" 2>&1 ||
  fail "the straight run to iteration $target exited $? (its output: $runs/straight.out)"
expect_same_tensors "$save" "$runs/straight" "$target" \
  "the signalled, requeued and resumed job ended with a straight run's bytes"
# Negative control: the same comparison tells the checkpoint the job resumed from from the final one.
resumed_from="$(iteration_dir "$save" "$stopped_at")"
for file in $(cd "$resumed_from" && ls -- *.safetensors); do
  ! cmp -s "$resumed_from/$file" "$(iteration_dir "$runs/straight" "$target")/$file" ||
    fail "negative control: $file at iteration $stopped_at equals the straight run's at $target"
done
tandem_log "ok: negative control: iteration $stopped_at's tensor files differ from iteration $target's"
tandem_log "all checks passed"
