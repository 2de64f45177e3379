"""`tandem data build` with SentencePieceTokenizer / Llama2Tokenizer, against Megatron's own code.

    check_sentencepiece.py --tandem BIN --venv DIR --work DIR --case NAME

The documents are check_bpe.py's (every Unicode general category, every White_Space character and
its near misses, whitespace runs, digits, contractions, emoji, 300 seeded random strings, list-valued
documents) plus SentencePiece's own hard cases (special pieces' text, NFKC-folded characters, bytes
the model lacks). For each case:
1. `tandem data build` tokenizes them with the case's .model (fixtures/tokenizers/sp-*) into
   PREFIX.bin / PREFIX.idx and prints the ids it took: "tokenizer: TYPE: EOD e, PAD p, V ids";
2. in the venv of tests/tokenizers/sentencepiece_env.py (sentencepiece 0.2.0, megatron-core
   0.16.1), Megatron's own `build_tokenizer(args)` (megatron/core/tokenizers/text/utils/
   build_tokenizer.py, what tools/preprocess_data.py builds without --legacy-tokenizer; the same
   class Megatron Core 0.19 builds) gives vocab_size, eod and pad, which must equal tandem's, and
   tokenizes each piece as preprocess_data.py's encode() does (`tokenizer.tokenize(text)`, EOD
   after each non-empty document: --append-eod);
3. megatron-core 0.16.1's IndexedDatasetBuilder writes those ids (DType.optimal_dtype of the
   vocabulary size) and both files must equal tandem's byte for byte.
The first document whose tokens differ is printed with both id lists (the diagnosis); the byte
comparison is the verdict. negative_control: one expected id is shifted; the check must fail.
Exact comparison throughout. A missing package fails the test: it never skips.
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "fixtures", "tokenizers")
sys.path.insert(0, HERE)

CASES = {
    # name: (Megatron's --tokenizer-type, the .model)
    "sp_unigram": ("SentencePieceTokenizer", os.path.join(FIXTURES, "sp-unigram", "tokenizer.model")),
    "sp_llama2": ("Llama2Tokenizer", os.path.join(FIXTURES, "sp-llama2", "tokenizer.model")),
}
CASES["negative_control"] = CASES["sp_llama2"]


def texts():
    import check_bpe
    return check_bpe.texts() + [
        "specials' text <s> </s> <pad> <unk> <sep> <EOD> <CLS> <SEP> <MASK> <extra_id_0> x<s>y",
        "\u2581 the meta symbol itself \u2581\u2581 and <0x41> <0xFF>",
        "NFKC: \uff21\uff22\uff23 \uff11\uff12\uff13 \ufb01 \u2460 \u00bd \u2167 \u3000wide\u3000space e\u0301",
        "unknown to the model: \u0f00 \ua000 \U0001d400 \U00020000 \x00 \x7f",
        "   leading, inner    and trailing runs   ", "\t", "\n", "123456789 0.5 -7",
    ]


def compare(args):
    """Runs in the venv: Megatron's tokenizer, its IndexedDatasetBuilder, and the comparison."""
    import importlib

    import dataset_verdict
    import numpy
    import sentencepiece_env

    modules = sentencepiece_env.import_megatron_sentencepiece()
    indexed = modules["indexed_dataset"]
    build_tokenizer = importlib.import_module("megatron.core.tokenizers.text.utils.build_tokenizer").build_tokenizer
    tokenizer_type, model = CASES[args.case]
    # preprocess_data.py's arguments that build_tokenizer reads, at their defaults.
    megatron_args = argparse.Namespace(tokenizer_type=tokenizer_type, tokenizer_model=model,
                                       tokenizer_sentencepiece_legacy=False, tokenizer_special_tokens=None,
                                       tokenizer_metadata=None)
    tokenizer = build_tokenizer(megatron_args)
    pad = tokenizer.pad
    expected_line = "tokenizer: %s: EOD %d, PAD %s, %d ids" % (
        tokenizer_type, tokenizer.eod, "none" if pad < 0 or pad == tokenizer.eod else str(pad), tokenizer.vocab_size)
    verdict = 0
    with open(os.path.join(args.work, "tandem.out")) as stream:
        tandem_line = next((line.strip() for line in stream if line.startswith("tokenizer: ")), None)
    if tandem_line != expected_line:
        print("FAIL: the ids differ\n  Megatron (%s): %s\n  tandem:   %s" % (type(tokenizer).__name__,
                                                                          expected_line, tandem_line))
        verdict = 1
    else:
        print("PASS: vocabulary size, EOD and PAD equal Megatron's build_tokenizer's: " + expected_line)

    with open(args.texts, encoding="utf-8") as stream:
        documents = [json.loads(line)["text"] for line in stream]
    expected_sequences = []  # per document: its sequences, as preprocess_data.py's encode() makes them
    for text in documents:
        sequences = [tokenizer.tokenize(piece) for piece in (text if isinstance(text, list) else [text])]
        sequences = [ids for ids in sequences if ids]
        if sequences:
            sequences[-1] = sequences[-1] + [tokenizer.eod]
        expected_sequences.append(sequences)
    if args.case == "negative_control":  # one id off must be caught
        first = next(d for d in expected_sequences if d and len(d[0]) > 1)
        first[0][0] = (first[0][0] + 1) % tokenizer.vocab_size

    prefix = os.path.join(args.work, "megatron")
    dtype = indexed.DType.optimal_dtype(tokenizer.vocab_size)
    builder = indexed.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for sequences in expected_sequences:
        builder.add_document(numpy.array([i for ids in sequences for i in ids], dtype=numpy.int64),
                             [len(ids) for ids in sequences])
    builder.finalize(prefix + ".idx")

    return dataset_verdict.judge(indexed, args.work, expected_sequences, documents, "Megatron", dtype.__name__,
                                 args.case == "negative_control", verdict)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem")
    parser.add_argument("--venv")
    parser.add_argument("--work", required=True)
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    parser.add_argument("--stage", default="main", choices=["main", "compare"])
    args = parser.parse_args()
    args.work = os.path.abspath(os.path.join(args.work, args.case))
    args.texts = os.path.join(args.work, "docs.jsonl")
    if args.stage == "compare":
        return compare(args)

    import sentencepiece_env
    os.makedirs(args.work, exist_ok=True)
    with open(args.texts, "w", encoding="utf-8") as stream:
        for text in texts():
            stream.write(json.dumps({"text": text}) + "\n")
    tokenizer_type, model = CASES[args.case]
    command = [args.tandem, "data", "build", "--input", args.texts, "--output-prefix",
               os.path.join(args.work, "tandem"), "--tokenizer-type", tokenizer_type, "--tokenizer-model", model]
    print("reproduce: " + " ".join(command))
    built = subprocess.run(command, capture_output=True, text=True)
    with open(os.path.join(args.work, "tandem.out"), "w") as stream:
        stream.write(built.stdout)
    if built.returncode != 0:
        print("FAIL: tandem data build exited %d:\n%s%s" % (built.returncode, built.stdout, built.stderr))
        return 1
    python = sentencepiece_env.ensure_venv(args.venv)
    return subprocess.run([python, __file__, "--work", os.path.dirname(args.work), "--case", args.case,
                           "--stage", "compare"]).returncode


if __name__ == "__main__":
    sys.exit(main())
