#!/usr/bin/env bash
# Regenerates the fuzzers' seed corpus, fixtures/fuzz/<target>/, from real files: datasets that
# `tandem data build` writes, checkpoints and an export that `tandem train` and `tandem export`
# write (one process, and two ranks with the distributed optimizer), and command lines (the seed's
# Megatron fragment, the CLI tests' tiny run) as argument lists and as --config files.
# Usage: tests/fuzz/make_seed_corpus.sh [BUILD_DIR]   (BUILD_DIR: a normal build with bin tandem;
#        default build). Needs python3 and, for the sharded checkpoint, mpirun.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "${1:-$root/build}" && pwd)"
tandem="$build/tandem"
out="$root/fixtures/fuzz"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$out"/{indexed_dataset,safetensors,manifest,config,arguments}
mkdir -p "$out"/{indexed_dataset,safetensors,manifest,config,arguments}

# --- indexed_dataset: PREFIX.idx and PREFIX.bin packed as fuzz_indexed_dataset.cpp reads them.
pack_dataset() {  # pack_dataset PREFIX NAME
  python3 - "$1" "$out/indexed_dataset/$2" <<'PY'
import struct, sys
prefix, target = sys.argv[1], sys.argv[2]
idx = open(prefix + ".idx", "rb").read()
binary = open(prefix + ".bin", "rb").read()
open(target, "wb").write(struct.pack("<I", len(idx)) + idx + binary)
PY
}
printf '%s\n' '{"text": "Hello, tandem."}' '{"text": ""}' '{"text": "two\nlines"}' >"$scratch/small.jsonl"
printf '%s\n' '{"text": ["first piece. ", "", "second piece."]}' '{"text": "ok"}' >"$scratch/pieces.jsonl"
printf '%s\n' '{"text": "x"}' >"$scratch/one.jsonl"
for name in small pieces one; do
  "$tandem" data build --input "$scratch/$name.jsonl" --output-prefix "$scratch/$name" >/dev/null
  pack_dataset "$scratch/${name}_text_document" "$name-uint16"
done
head -n 3 "$root/fixtures/corpus/default.jsonl" >"$scratch/corpus3.jsonl"
"$tandem" data build --input "$scratch/corpus3.jsonl" --output-prefix "$scratch/corpus3" >/dev/null
pack_dataset "$scratch/corpus3_text_document" corpus-first-3-documents

# --- checkpoints: a tiny model (1 layer, width 8) so each tensor file stays a few kilobytes.
tiny=(--num-layers 1 --hidden-size 8 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1
  --global-batch-size 2 --train-samples 4 --lr 1e-3 --quiet --data-cache "$scratch/data")
"$tandem" train --engine reference "${tiny[@]}" --save "$scratch/reference" >/dev/null
"$tandem" train --engine production --device cpu "${tiny[@]}" --save "$scratch/production" >/dev/null
mpirun -np 2 --oversubscribe "$tandem" train --engine production --device cpu "${tiny[@]}" \
  --use-distributed-optimizer --save "$scratch/sharded" >/dev/null
"$tandem" export --load "$scratch/production" --hf "$scratch/hf" >/dev/null
for run in reference production; do
  cp "$scratch/$run/iter_0000002/model.safetensors" "$out/safetensors/$run-model"
  cp "$scratch/$run/iter_0000002/optimizer.safetensors" "$out/safetensors/$run-optimizer"
  cp "$scratch/$run/iter_0000002/manifest.json" "$out/manifest/$run"
done
cp "$scratch/sharded/iter_0000002/shard_00000_of_00002.safetensors" "$out/safetensors/sharded-shard-0"
cp "$scratch/sharded/iter_0000002/manifest.json" "$out/manifest/sharded"
cp "$scratch/hf/model.safetensors" "$out/safetensors/hf-export"

# --- arguments (one word a line) and config (the same runs as --config files).
command_lines=(
  "$(cat "$root/fixtures/seed/megatron_args.txt" "$root/fixtures/seed/architecture_500b.txt")"
  "--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --seq-length 32 --micro-batch-size 2 --global-batch-size 4 --train-samples 24 --lr 3e-3 --min-lr 3e-4
   --lr-warmup-samples 8 --lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1"
  "--num-layers 8 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 1
   --global-batch-size 16 --world-size 8 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 2
   --num-layers-per-virtual-pipeline-stage 2 --train-tokens 1M --lr-warmup-tokens 100K --lr 1e-3
   --recompute-granularity full --recompute-method block --recompute-num-layers 1"
  "--train-iters 10 --lr-warmup-iters 2 --lr-decay-iters 8 --weight-decay-incr-style linear
   --start-weight-decay 0.01 --end-weight-decay 0.1 --packing units --data-order sequential --split 90,9,1"
)
index=0
for line in "${command_lines[@]}"; do
  index=$((index + 1))
  words=()
  read -r -d '' -a words <<<"$line" || true
  printf '%s\n' "${words[@]}" >"$out/arguments/command-line-$index"
  "$tandem" plan "${words[@]}" >/dev/null 2>&1 || echo "note: command line $index is refused by tandem plan (kept: a refused seed is a seed too)" >&2
  python3 - "$out/config/command-line-$index.json" "${words[@]}" <<'PY'
import json, sys
target, words = sys.argv[1], sys.argv[2:]
config, i = {}, 0
while i < len(words):
    key = words[i][2:]
    if i + 1 < len(words) and not words[i + 1].startswith("--"):
        value = words[i + 1]
        try:
            value = int(value)
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                pass
        config[key], i = value, i + 2
    else:
        config[key], i = True, i + 1
json.dump(config, open(target, "w"), indent=1)
PY
done
du -sh "$out"/*
