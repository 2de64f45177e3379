"""The learning rate and weight decay of every update against megatron-core 0.16.1's
OptimizerParamScheduler (SPEC 8). Exact comparison: both sides compute in IEEE double with the same
operations, and `tandem schedule --csv` prints the shortest text that reads back to the same double.

    check_megatron_schedule.py --tandem BIN --venv DIR --case NAME

Megatron, for a --train-samples run, counts the scheduler in samples: lr_warmup_steps =
--lr-warmup-samples, lr_decay_steps = --lr-decay-samples, wd_incr_steps = --train-samples, and
steps by the global batch after every successful update; the lr (and wd) an update uses is the
one the scheduler set after the updates before it (SPEC 8: update k uses lr((k-1) x GBS)).
`negative_control` compares against a scheduler one update ahead and must fail.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_env  # noqa: E402

SEED_ARGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "seed",
                         "megatron_args.txt")

# Small schedules where every boundary falls on or beside an update: the warmup's end, the end of
# the decay, updates beyond it, and the weight-decay increments.
SMALL = ["--global-batch-size", "4", "--micro-batch-size", "1", "--lr", "3e-4", "--min-lr", "3e-5",
         "--lr-warmup-init", "1e-5"]
CASES = {
    "seed": None,  # fixtures/seed/megatron_args.txt: 635,782 updates
    "linear_past_decay": SMALL + ["--lr-decay-style", "linear", "--lr-warmup-samples", "20",
                                  "--lr-decay-samples", "100", "--train-samples", "160"],
    "cosine_uneven_warmup": SMALL + ["--lr-decay-style", "cosine", "--lr-warmup-samples", "18",
                                     "--lr-decay-samples", "122", "--train-samples", "150"],
    "constant_after_warmup": SMALL + ["--lr-decay-style", "constant", "--lr-warmup-samples", "12",
                                      "--train-samples", "60"],
    "no_warmup_linear_wd": SMALL + ["--lr-decay-style", "cosine", "--train-samples", "80",
                                    "--weight-decay-incr-style", "linear", "--start-weight-decay", "0.01",
                                    "--end-weight-decay", "0.1"],
    "cosine_wd": SMALL + ["--lr-decay-style", "linear", "--lr-warmup-samples", "8", "--train-samples", "98",
                          "--weight-decay-incr-style", "cosine", "--start-weight-decay", "0.0",
                          "--end-weight-decay", "0.3"],
}
CASES["negative_control"] = CASES["cosine_uneven_warmup"]


def option(arguments, name, default=None):
    return arguments[arguments.index(name) + 1] if name in arguments else default


class StandInOptimizer:
    """What the scheduler touches: param_groups, dictionaries it writes lr and weight_decay into."""

    def __init__(self):
        self.param_groups = [{}]


def megatron_rows(arguments, updates, modules, ahead):
    scheduler_module = modules
    gbs = int(option(arguments, "--global-batch-size"))
    train_samples = int(option(arguments, "--train-samples"))
    weight_decay = float(option(arguments, "--weight-decay", "0.01"))
    style = option(arguments, "--weight-decay-incr-style", "constant")
    start_wd = float(option(arguments, "--start-weight-decay", str(weight_decay)))
    end_wd = float(option(arguments, "--end-weight-decay", str(weight_decay)))
    if style == "constant":
        start_wd = end_wd = weight_decay
    optimizer = StandInOptimizer()
    scheduler = scheduler_module.OptimizerParamScheduler(
        optimizer,
        init_lr=float(option(arguments, "--lr-warmup-init", "0.0")),
        max_lr=float(option(arguments, "--lr")),
        min_lr=float(option(arguments, "--min-lr", "0.0")),
        lr_warmup_steps=int(option(arguments, "--lr-warmup-samples", "0")),
        lr_decay_steps=int(option(arguments, "--lr-decay-samples", str(train_samples))),
        lr_decay_style=option(arguments, "--lr-decay-style", "linear"),
        start_wd=start_wd, end_wd=end_wd, wd_incr_steps=train_samples, wd_incr_style=style)
    if ahead:
        scheduler.step(gbs)
    rows = []
    for update in range(1, updates + 1):
        group = optimizer.param_groups[0]
        rows.append("%d,%d,%r,%r" % (update, (update - 1) * gbs, group["lr"], group["weight_decay"]))
        scheduler.step(gbs)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--venv", required=True)
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    args = parser.parse_args()
    megatron_env.reexec_in_venv(args.venv)
    import importlib
    megatron_env.import_megatron()
    modules = importlib.import_module("megatron.core.optimizer_param_scheduler")

    arguments = CASES[args.case]
    if arguments is None:
        with open(SEED_ARGS) as seed:
            arguments = seed.read().split()
    command = [args.tandem, "schedule", "--csv"] + arguments
    result = subprocess.run(command, capture_output=True, text=True)
    print("reproduce: " + " ".join(command))
    if result.returncode != 0:
        print("FAIL: tandem schedule exited %d:\n%s" % (result.returncode, result.stderr))
        return 1
    lines = result.stdout.splitlines()
    if not lines or lines[0] != "update,consumed_samples,lr,wd":
        print("FAIL: unexpected header: %r" % lines[:1])
        return 1
    actual = []
    for line in lines[1:]:
        update, consumed, lr, wd = line.split(",")
        actual.append("%d,%d,%r,%r" % (int(update), int(consumed), float(lr), float(wd)))
    updates = int(option(arguments, "--train-samples")) // int(option(arguments, "--global-batch-size"))
    ahead = args.case == "negative_control"
    expected = megatron_rows(arguments, updates, modules, ahead)
    first = next((i for i in range(max(len(expected), len(actual)))
                  if i >= len(expected) or i >= len(actual) or expected[i] != actual[i]), None)
    print("%s: %d updates from Megatron, %d from tandem" % (args.case, len(expected), len(actual)))
    if first is not None:
        print("first difference at update %d:\n  megatron: %s\n  tandem:   %s" % (
            first + 1, expected[first] if first < len(expected) else "(none)",
            actual[first] if first < len(actual) else "(none)"))
    equal = first is None
    if equal != ahead:
        print("PASS: " + ("every update's lr and wd equal" if equal else "a shifted schedule is caught"))
        return 0
    print("FAIL")
    return 1


if __name__ == "__main__":
    sys.exit(main())
