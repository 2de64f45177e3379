"""The indexed dataset both ways against megatron-core 0.16.1 (SPEC 2: "Files written by Megatron's
tools/preprocess_data.py must load, and ours must load in Megatron"). Exact comparison.

    check_megatron_indexed.py --tandem BIN --venv DIR --work DIR --case NAME

megatron_writes_DTYPE: Megatron's IndexedDatasetBuilder writes documents (one of them empty, one
    of two sequences, as sentence splitting writes) in DTYPE; `tandem data samples --data-order
    sequential` must read the sequences' tokens in dataset order: sample i is tokens
    [i L, i L + L + 1) of their concatenation (docs/DATA.md section 5).
tandem_writes: `tandem data build` writes JSON Lines documents (one empty, multi-byte UTF-8);
    Megatron's IndexedDataset must read dtype uint16, one sequence per non-empty document holding
    its UTF-8 bytes and EOD 256, and the document indices (the empty one repeating its neighbour's).
negative_control: the tandem_writes check run on a deliberately shifted expectation must fail.
The expected values are derived here from what was written; Megatron does the writing or reading.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_env  # noqa: E402

EOD = 256
SEQ_LENGTH = 7
DTYPES = ["uint8", "int8", "int16", "int32", "int64", "uint16"]  # Megatron's integer DType codes
# Token values stay below these (each dtype's positive range, the others near uint16's top);
# tandem reads them as a NullTokenizer's data of VOCAB ids with EOD 256 (a vocabulary other than the
# byte tokenizer's must name its tokenizer: docs/DATA.md section 13).
TOKEN_LIMIT = {"uint8": 256, "int8": 128, "int16": 32768, "int32": 65000, "int64": 65000, "uint16": 65000}
VOCAB = 65536


def documents_for(dtype):
    """Token lists per document; each inner list one sequence. Values fit every dtype asked."""
    top = TOKEN_LIMIT[dtype]  # spans the dtype's width, so a misread item size shows
    eod = [] if dtype in ("uint8", "int8") else [EOD]
    docs = []
    for d in range(23):
        length = 1 + (d * 13 + 5) % 17
        docs.append([[(d * 7919 + k * 104729) % top for k in range(length)] + eod])
    docs[5] = []                               # an empty document: no sequence (preprocess_data)
    docs[9] = [docs[9][0][:3], docs[9][0][3:]]  # a document of two sequences
    return docs


def megatron_writes(args, dtype):
    import numpy
    modules = megatron_env.import_megatron()
    prefix = os.path.join(args.work, "megatron_" + dtype)
    builder = modules["indexed_dataset"].IndexedDatasetBuilder(prefix + ".bin", dtype=getattr(numpy, dtype))
    docs = documents_for(dtype)
    for doc in docs:
        tokens = [t for sequence in doc for t in sequence]
        builder.add_document(numpy.array(tokens, dtype=numpy.int64), [len(s) for s in doc])
    builder.finalize(prefix + ".idx")
    stream = [t for doc in docs for sequence in doc for t in sequence]
    windows = (len(stream) - 1) // SEQ_LENGTH
    expected = [" ".join(map(str, [i] + stream[i * SEQ_LENGTH:i * SEQ_LENGTH + SEQ_LENGTH + 1]))
                for i in range(windows)]
    command = [args.tandem, "data", "samples", "--data-path", prefix, "--data-order", "sequential",
               "--seq-length", str(SEQ_LENGTH), "--count", str(windows), "--train-samples", "8",
               "--tokenizer-type", "NullTokenizer", "--vocab-size", str(VOCAB),
               "--null-tokenizer-eod-id", str(EOD),
               "--global-batch-size", "1", "--micro-batch-size", "1"]
    result = subprocess.run(command, capture_output=True, text=True)
    print("reproduce: " + " ".join(command))
    if result.returncode != 0:
        print("FAIL: tandem refused Megatron's %s file (exit %d):\n%s" % (dtype, result.returncode, result.stderr))
        return 1
    return verdict(expected, result.stdout.splitlines(), "windows of Megatron's %s dataset" % dtype)


def tandem_writes(args, shift_expected):
    texts = ["hello", "", "caf\u00e9 \u2603 \U0001F600", "a" * 40, "line\nbreak", "z"]
    jsonl = os.path.join(args.work, "tandem_docs.jsonl")
    with open(jsonl, "w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text}) + "\n")
    output_prefix = os.path.join(args.work, "tandem_docs" + ("_shifted" if shift_expected else ""))
    subprocess.run([args.tandem, "data", "build", "--input", jsonl, "--output-prefix", output_prefix],
                   check=True, stdout=subprocess.DEVNULL)
    prefix = output_prefix + "_text_document"  # preprocess_data.py's name for the default key
    modules = megatron_env.import_megatron()
    dataset = modules["indexed_dataset"].IndexedDataset(prefix)
    expected_sequences = [list(t.encode("utf-8")) + [EOD] for t in texts if t]
    if shift_expected:  # negative control: one token off must be caught
        expected_sequences[0][0] += 1
    expected_document_indices = [0]
    for text in texts:
        expected_document_indices.append(expected_document_indices[-1] + (1 if text else 0))
    expected = ["dtype %s" % "uint16"] + ["document_indices %s" % expected_document_indices] + \
        ["sequence %d %s" % (i, s) for i, s in enumerate(expected_sequences)]
    actual = ["dtype %s" % dataset.index.dtype.__name__] + \
        ["document_indices %s" % dataset.document_indices.tolist()] + \
        ["sequence %d %s" % (i, dataset[i].tolist()) for i in range(len(dataset))]
    what = "Megatron's reading of tandem's files"
    if shift_expected:
        return 0 if verdict(expected, actual, what) == 1 else 1
    return verdict(expected, actual, what)


def verdict(expected, actual, what):
    for index in range(max(len(expected), len(actual))):
        left = expected[index] if index < len(expected) else "(none)"
        right = actual[index] if index < len(actual) else "(none)"
        if left != right:
            print("FAIL: %s: line %d differs\n  expected: %s\n  actual:   %s" % (what, index, left[:300], right[:300]))
            return 1
    print("PASS: %s: %d lines equal" % (what, len(expected)))
    return 0


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem", required=True)
    parser.add_argument("--venv", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--case", required=True,
                        choices=["megatron_writes_" + d for d in DTYPES] + ["tandem_writes", "negative_control"])
    args = parser.parse_args()
    megatron_env.reexec_in_venv(args.venv)
    os.makedirs(args.work, exist_ok=True)
    if args.case.startswith("megatron_writes_"):
        return megatron_writes(args, args.case[len("megatron_writes_"):])
    return tandem_writes(args, shift_expected=args.case == "negative_control")


if __name__ == "__main__":
    sys.exit(main())
