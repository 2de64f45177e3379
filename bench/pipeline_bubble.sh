#!/usr/bin/env bash
# The pipeline's measured idle time against the plan's bubble (issue 12): `tandem train
# --log-pipeline-timeline` on PP 2 (1F1B, and interleaved with 2 chunks a rank) on the production
# engine's cpu backend, two MPI ranks; prints, per schedule, the measured idle fraction of the last
# iteration (tandem timeline), the plan's (p - 1) / (v m + p - 1), and their ratio.
# Usage: bench/pipeline_bubble.sh TANDEM_BINARY [HIDDEN_SIZE]   (default hidden size 512)
# Meaningful only with a free core per stage: each stage's passes must not wait for a core, and
# they must be long against an exchange (here tens of milliseconds against tens of microseconds).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 TANDEM_BINARY [HIDDEN_SIZE]" >&2; exit 2; }
tandem="$(realpath "$1")"
hidden="${2:-512}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# Balanced stages: 8 layers, 4 a stage; the untied output layer over the byte vocabulary (258 rows)
# costs the last stage about what the embedding lookup costs the first, against 4 layers of width
# HIDDEN. 8 microbatches a replica: the plan's bubble is 1/9 (1F1B) and 1/17 (2 chunks).
run=(train --engine production --device cpu --num-layers 8 --hidden-size "$hidden" --num-attention-heads 8
  --seq-length 256 --micro-batch-size 1 --global-batch-size 8 --train-samples 24 --lr 1e-3
  --pipeline-model-parallel-size 2 --untie-embeddings-and-output-weights --log-pipeline-timeline --quiet
  --data-cache "$work/data")
printf '%-28s %10s %10s %8s %12s\n' schedule measured plan ratio iteration_s
for chunks in 1 2; do
  extra=()
  [ "$chunks" -gt 1 ] && extra=(--num-virtual-stages-per-pipeline-rank "$chunks")
  mpirun -np 2 --oversubscribe --bind-to core "$tandem" "${run[@]}" "${extra[@]}" --save "$work/run$chunks" >"$work/out$chunks" 2>&1 ||
    { cat "$work/out$chunks" >&2; exit 1; }
  python3 - "$work/run$chunks/log.jsonl" "$chunks" <<'PY'
import json, sys
timelines = [r for r in map(json.loads, open(sys.argv[1])) if r.get("type") == "pipeline_timeline"]
last = timelines[-1]
measured, plan = last["idle_fraction"], last["plan_idle_fraction"]
name = "1F1B" if sys.argv[2] == "1" else f"interleaved 1F1B, {sys.argv[2]} chunks"
print(f"{name:<28} {100*measured:9.1f}% {100*plan:9.1f}% {measured/plan:8.2f} {last['span_seconds']:12.3f}")
PY
done
