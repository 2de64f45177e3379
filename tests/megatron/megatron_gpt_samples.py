"""Prints the samples megatron-core 0.16.1's GPTDataset builds, one per line as "INDEX TOKENS...",
the L+1 tokens of each (its tokens and its last label), in the format of `tandem data samples`.

    megatron_gpt_samples.py --venv DIR --data-path [W1] P1 [[W2] P2 ...] --seq-length L --seed S
        --split a,b,c --sizes TRAIN,VALID,TEST --part train|valid

Reads --data-path with Megatron's own get_blend_from_list, builds with its own builder
(BlendedMegatronDatasetBuilder: --split, and a BlendedDataset for a blend or a weighted prefix)
and reads every sample through __getitem__, checking that its labels are its tokens shifted by
one. The environment comes from megatron_env.py (made on first use, then reused).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_env  # noqa: E402


class StandInTokenizer:
    """What GPTDataset asks of a tokenizer: its ids, and a description for the cache's hash."""

    def __init__(self, eod, pad):
        self.eod = eod
        self.pad = pad
        self.vocab_size = None  # no dtype demand on the .bin: read the .idx's own dtype
        self.unique_identifiers = {"class": "tandem-test-tokenizer", "eod": eod, "pad": pad}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--venv", required=True)
    parser.add_argument("--data-path", nargs="+", required=True)
    parser.add_argument("--seq-length", type=int, required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--split", required=True)
    parser.add_argument("--sizes", required=True, help="train,valid,test num_samples")
    parser.add_argument("--part", choices=["train", "valid"], default="train")
    parser.add_argument("--eod", type=int, default=256)
    parser.add_argument("--pad", type=int, default=257)
    args = parser.parse_args()
    megatron_env.reexec_in_venv(args.venv)

    modules = megatron_env.import_megatron()
    gpt = modules["gpt_dataset"]
    builder_module = modules["blended_megatron_dataset_builder"]
    config = gpt.GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=modules["utils"].get_blend_from_list(args.data_path),
        split=args.split,
        # No path_to_cache: GPTDataset then caches its indices beside the dataset (PREFIX's
        # folder/cache), as Megatron does by default, and BlendedDataset builds its own in memory
        # (with a cache path it asks torch.distributed for a rank, which needs a process group).
        path_to_cache=None,
        tokenizer=StandInTokenizer(args.eod, args.pad),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    sizes = [int(value) for value in args.sizes.split(",")]
    datasets = builder_module.BlendedMegatronDatasetBuilder(
        gpt.GPTDataset, sizes, lambda: True, config).build()
    dataset = datasets[0 if args.part == "train" else 1]
    if dataset is None:
        raise SystemExit("megatron-core built no %s dataset for --split %s" % (args.part, args.split))
    out = []
    for index in range(len(dataset)):
        item = dataset[index]
        tokens = item["tokens"].tolist()
        labels = item["labels"].tolist()
        if tokens[1:] != labels[:-1]:
            raise SystemExit("sample %d: Megatron's labels are not its tokens shifted by one" % index)
        out.append(" ".join(str(value) for value in [index] + tokens + labels[-1:]))
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))


if __name__ == "__main__":
    main()
