"""`--data-order megatron` against megatron-core 0.16.1 itself: every sample's L+1 tokens that
`tandem data samples` prints must equal those Megatron's GPTDataset returns (megatron_gpt_samples.py),
in the same order, and both must hold the same number of samples. Exact comparison.

    check_megatron_order.py --tandem BIN --venv DIR --work DIR --case NAME

Each case is one configuration (CASES below); `negative_control` inverts the verdict: tandem's
own shuffled order must NOT match, which shows the comparison can fail. The expected side is
computed by Megatron at test time; nothing here is a pasted result. Exit status 0 = the case
holds, 1 = it does not (the first difference is printed), 2 = the setup failed.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# Document lengths in bytes before EOD: a fixed, irregular spread (1 to 37) so that sequence
# lengths never divide them evenly; each document's text is distinct so windows identify it.
def corpus_lines(count, salt=0):
    lines = []
    for d in range(count):
        length = 1 + (d * 17 + d * d * 5 + salt * 11) % 37
        text = "".join(chr(ord("a") + (d + k) % 26) for k in range(length))
        lines.append('{"text": "%s"}' % text)
    return lines


class Case:
    def __init__(self, name, seq_length, train_samples, documents=40, seed=1234, split=None,
                 part="train", eval_iters=0, eval_interval=0, global_batch=1,
                 data_order="megatron", expect_equal=True, why="", weights=None):
        self.name, self.seq_length, self.train_samples = name, seq_length, train_samples
        self.documents, self.seed, self.split, self.part = documents, seed, split, part
        self.eval_iters, self.eval_interval, self.global_batch = eval_iters, eval_interval, global_batch
        self.data_order, self.expect_equal, self.why = data_order, expect_equal, why
        # A blend: one dataset per entry (each its own corpus), weighted when the entries are
        # numbers, weighted by sizes when they are None.
        self.weights = weights


# 40 documents hold 40 EODs + sum of lengths tokens (about 800); L in 5..50.
CASES = {c.name: c for c in [
    Case("one_epoch", seq_length=7, train_samples=60, why="fewer samples than one epoch holds"),
    Case("several_epochs_separate_last", seq_length=5, train_samples=340,
         why="a few epochs whose last one supplies < 80% of an epoch: shuffled apart"),
    Case("several_epochs_joint_last", seq_length=5, train_samples=460,
         why="a few epochs whose last one supplies >= 80% of an epoch: one shuffle"),
    Case("long_windows", seq_length=50, train_samples=30, seed=7,
         why="windows longer than every document, several epochs"),
    Case("split_train", seq_length=9, train_samples=200, split="8,2,0", seed=42,
         why="the train part of --split 8,2,0"),
    Case("split_valid", seq_length=9, train_samples=200, split="8,2,0", part="valid",
         eval_iters=3, eval_interval=4, global_batch=4,
         why="the valid part's own GPTDataset, sized by the evaluation's samples"),
    Case("blend_three_weighted", seq_length=6, train_samples=600, weights=["0.2", "0.3", "0.5"],
         why="Megatron's BlendedDataset of three weighted datasets, the largest share over two epochs"),
    Case("blend_by_sizes", seq_length=6, train_samples=150, weights=[None, None],
         why="two prefixes without weights: each one epoch, weighted by its samples"),
    Case("one_weighted_prefix", seq_length=5, train_samples=457, weights=["1"],
         why="a lone prefix given a weight: Megatron blends it and builds 0.5% more samples "
             "(460), which here shuffles the last epoch jointly where 457 would shuffle it apart"),
    Case("negative_control", seq_length=7, train_samples=60, data_order="shuffled",
         expect_equal=False, why="tandem's own order must differ from Megatron's"),
]}


def megatron_sizes(case):
    """Megatron-LM's get_train_valid_test_num_samples for a --train-samples run."""
    train_iters = case.train_samples // case.global_batch
    valid = (train_iters // case.eval_interval + 1 if case.eval_interval > 0 else 1) * case.eval_iters
    return [case.train_samples, valid * case.global_batch, case.eval_iters * case.global_batch]


def run(command, what):
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        sys.stderr.write("%s failed (exit %d): %s\n%s" % (what, result.returncode, " ".join(command),
                                                         result.stderr[-4000:]))
        sys.exit(2)
    return result.stdout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--venv", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    args = parser.parse_args()
    case = CASES[args.case]
    work = os.path.join(args.work, case.name)
    os.makedirs(work, exist_ok=True)
    data_path = []
    for d, weight in enumerate(case.weights or [None]):
        jsonl = os.path.join(work, "docs%d.jsonl" % d)
        with open(jsonl, "w") as out:
            out.write("\n".join(corpus_lines(case.documents + 7 * d, salt=d)) + "\n")
        output_prefix = os.path.join(work, "docs%d" % d)
        run([args.tandem, "data", "build", "--input", jsonl, "--output-prefix", output_prefix], "tandem data build")
        prefix = output_prefix + "_text_document"  # preprocess_data.py's name for the default key
        data_path += ([weight] if weight else []) + [prefix]

    tandem_command = [args.tandem, "data", "samples", "--data-path"] + data_path + [
                      "--data-order", case.data_order,
                      "--seq-length", str(case.seq_length),
                      "--train-samples", str(case.train_samples), "--seed", str(case.seed),
                      "--global-batch-size", str(case.global_batch), "--micro-batch-size", "1",
                      "--part", case.part]
    if case.split:
        tandem_command += ["--split", case.split]
    if case.eval_iters:
        tandem_command += ["--eval-iters", str(case.eval_iters), "--eval-interval", str(case.eval_interval)]
    megatron_command = ["/usr/bin/python3", os.path.join(HERE, "megatron_gpt_samples.py"),
                        "--venv", args.venv, "--data-path"] + data_path + ["--seq-length", str(case.seq_length),
                        "--seed", str(case.seed), "--split", case.split or "1,0,0",
                        "--sizes", ",".join(str(s) for s in megatron_sizes(case)),
                        "--part", case.part]
    expected = run(megatron_command, "megatron-core").splitlines()
    if case.data_order != "megatron" or case.weights:
        # A blend's length is Megatron's (BlendedDataset size); tandem's blend stream has none.
        tandem_command += ["--count", str(len(expected))]
    actual = run(tandem_command, "tandem data samples").splitlines()

    print("case %s (%s): Megatron %d samples, tandem %d" % (case.name, case.why, len(expected), len(actual)))
    print("reproduce: " + " ".join(tandem_command))
    print("expected:  " + " ".join(megatron_command))
    first_difference = None
    for index in range(max(len(expected), len(actual))):
        left = expected[index] if index < len(expected) else "(none)"
        right = actual[index] if index < len(actual) else "(none)"
        if left != right:
            first_difference = (index, left, right)
            break
    equal = first_difference is None and len(expected) > 0
    differing = sum(1 for a, b in zip(expected, actual) if a != b)
    if first_difference:
        index, left, right = first_difference
        print("first difference at line %d (%d of %d lines differ):\n  megatron: %s\n  tandem:   %s"
              % (index, differing, len(expected), left[:300], right[:300]))
    if equal == case.expect_equal:
        print("PASS: " + ("every sample equal" if equal else "the orders differ, as they must"))
        return 0
    print("FAIL: " + ("expected equal samples" if case.expect_equal else
                      "tandem's own order matched Megatron's: the comparison cannot tell orders apart"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
