#!/usr/bin/env python3
"""ci/gpu-check's two readers of its own logs (standard library only; the GPU image has python3).

  gpu-check-summary.py --compare LOGS
      The tiny model's per-iteration loss and gradient norm on production cuda against the
      reference (and production cpu); writes LOGS/train_comparison.json; exit 1 beyond the
      threshold or when a run is missing. A smoke threshold, not a derived bound (the harness's
      properties hold the derived bounds): fp32 twins over 10 updates of a tiny model agree to
      about 1e-5 relative, so 1e-3 catches a wrong kernel without flagging summation order.
  gpu-check-summary.py LOGS SUMMARY_JSON BUDGET_S SECONDS FAILED
      summary.json from LOGS/steps.tsv and the step reports beside it.
"""
import json
import os
import sys

TRAIN_THRESHOLD_RELATIVE = 1e-3


def compare(logs):
    def records(name):
        rows = []
        with open(os.path.join(logs, f"train_{name}.jsonl")) as f:
            for line in f:
                record = json.loads(line)
                if record.get("type") == "iteration":
                    rows.append(record)
        return rows

    runs = {name: records(name) for name in ("reference", "cpu", "cuda")}
    result = {"threshold_relative": TRAIN_THRESHOLD_RELATIVE, "iterations": len(runs["cuda"]), "pairs": {}}
    ok = len(runs["cuda"]) > 0 and len(runs["cuda"]) == len(runs["reference"])
    for other in ("reference", "cpu"):
        worst = {"loss": 0.0, "grad_norm": 0.0}
        for a, b in zip(runs["cuda"], runs[other]):
            for key in worst:
                if a.get(key) is None or b.get(key) is None:
                    ok = False
                    continue
                scale = max(abs(b[key]), 1e-30)
                worst[key] = max(worst[key], abs(a[key] - b[key]) / scale)
        result["pairs"][f"cuda_vs_{other}"] = worst
        if other == "reference" and max(worst.values()) > TRAIN_THRESHOLD_RELATIVE:
            ok = False
    result["passed"] = ok
    with open(os.path.join(logs, "train_comparison.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))
    return 0 if ok else 1


def read_tsv(path, keys):
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                rows.append(dict(zip(keys, fields)))
    return rows


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return text


def lines(path, limit=200):
    if not os.path.exists(path):
        return None
    with open(path, errors="replace") as f:
        kept = [line.rstrip("\n") for line in f if line.strip()]
    return kept[-limit:]


def summarize(logs, summary_path, budget_s, seconds, failed):
    steps = read_tsv(os.path.join(logs, "steps.tsv"), ("name", "status", "seconds", "exit", "log"))
    for step in steps:
        step["seconds"] = number(step["seconds"])
        step["exit"] = number(step["exit"])
    summary = {
        "format": "tandem-gpu-check", "format_version": 5,
        "passed": failed == "0", "budget_s": int(budget_s), "seconds": number(seconds),
        "logs": "gpu-check-logs.tar.gz (tar xzf; everything below is read from it)",
        "steps": steps,
        "cuda_ops_tests": [dict(row, seconds=number(row.get("seconds"))) for row in
                           read_tsv(os.path.join(logs, "cuda_ops_tests.tsv"), ("test", "result", "seconds"))],
        "equivalence_cuda": read_tsv(os.path.join(logs, "equivalence_cuda", "results.tsv"),
                                     ("property", "exit", "seconds")),
    }
    for name in ("binaries.txt", "bundle-manifest.txt"):
        found = lines(os.path.join(logs, name), limit=3)
        if found:
            summary[name[:-4].replace("-", "_")] = found
    facts = lines(os.path.join(logs, "device_facts.log"), limit=100000)
    if facts:
        # The -L and --query-gpu sections and torch's line; nvidia-smi -q stays in the archive.
        keep, section = [], ""
        for line in facts:
            if line.startswith("== "):
                section = line
            if "nvidia-smi -q" not in section:
                keep.append(line)
        summary["device_facts"] = keep[:40]
    for name in ("train_bench.json", "train_comparison.json"):
        path = os.path.join(logs, name)
        if os.path.exists(path):
            try:
                with open(path) as f:
                    summary[name[:-5]] = json.load(f)
            except ValueError as error:
                summary[name[:-5]] = f"unreadable: {error}"
    for mode in ("gemm", "attention", "update"):
        found = lines(os.path.join(logs, f"bench_{mode}.log"))
        if found is not None:
            summary[f"bench_{mode}_lines"] = found
    found = lines(os.path.join(logs, "train_bench.log"), limit=60)
    if found is not None:
        summary["train_bench_lines"] = found
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--compare":
        sys.exit(compare(sys.argv[2]))
    if len(sys.argv) == 6:
        sys.exit(summarize(*sys.argv[1:6]))
    sys.exit("usage: gpu-check-summary.py --compare LOGS | LOGS SUMMARY_JSON BUDGET_S SECONDS FAILED")
