#!/usr/bin/env bash
# The batch job of tests/slurm/slurm_test.sh, submitted with `sbatch --requeue --signal=TERM@N`:
# the pattern of a long pretraining run under Slurm. Its first start trains with no end in sight
# until Slurm's time-limit warning (SIGTERM to the ranks) stops every rank with a checkpoint; the
# job then requeues itself, and the next start resumes from that checkpoint (--load) and trains
# MORE_ITERATIONS further, to a fixed iteration (--exit-interval) that a straight run can repeat.
# Usage: sbatch ... requeue_job.sh SAVE MORE_ITERATIONS TANDEM train ARGUMENTS...
# It writes SAVE.target (the iteration the resumed run ends at) after its first start.
set -uo pipefail

save="$1" more_iterations="$2"
shift 2
tracker="$save/latest_checkpointed_iteration.txt"
target_file="$save.target"
echo "requeue_job: job $SLURM_JOB_ID start ${SLURM_RESTART_COUNT:-0} at $(date +%s.%N)"

resume=()
if [ -f "$tracker" ]; then
  resume=(--load "$save" --exit-interval "$(cat "$target_file")")
fi
srun --mpi=pmix "$@" --save "$save" --exit-signal-handler "${resume[@]}"
status=$?
reached="$(cat "$tracker" 2>/dev/null || echo 0)"
echo "requeue_job: tandem exited $status at iteration $reached at $(date +%s.%N)"
[ -f "$target_file" ] || echo "$((reached + more_iterations))" >"$target_file"

if [ "$status" -eq 0 ] && [ "$reached" -lt "$(cat "$target_file")" ]; then
  echo "requeue_job: stopped before iteration $(cat "$target_file"): requeueing"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
