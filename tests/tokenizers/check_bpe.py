"""`tandem data build` with a byte-level BPE, token for token and byte for byte against the real thing.

    check_bpe.py --tandem BIN --transformers-venv DIR --megatron-venv DIR --work DIR --case NAME

Each case builds texts that reach every Unicode general category (Python 3.11's unicodedata:
Unicode 14, the tables of Debian 12's PCRE2 10.42 and of tokenizers 0.19's Oniguruma), every
White_Space character and its near misses (U+001C..U+001F, U+0085, U+200B), whitespace runs,
digits, contractions in both cases, emoji sequences, the special tokens' text, and 300 seeded
random strings; then:
1. `tandem data build` tokenizes them with the case's tokenizer into preprocess_data.py's
   PREFIX_text_document.bin / .idx (gpt2_two_keys: each line also holds a "title", the texts in
   reverse order, and `--json-keys text title` writes PREFIX_text_document and
   PREFIX_title_document from one pass, each held to Megatron's builder on its own key's texts);
2. Hugging Face's pinned packages tokenize the same texts (tests/hf/transformers_env.py's venv):
   HuggingFaceTokenizer cases as Megatron Core 0.19 does, `AutoTokenizer(DIR)(text).input_ids`;
   the GPT2BPETokenizer case with `tokenizers`' BPE over vocab.json/merges.txt and GPT-2's
   ByteLevel pre-tokenizer, no special token matched in the text (Megatron-LM's own GPT-2
   tokenizer, core_v0.16.1, whose `regex` patterns match the same White_Space set);
3. megatron-core 0.16.1's IndexedDatasetBuilder writes those ids as preprocess_data.py's encode()
   does (each non-empty piece one sequence, EOD after the document, DType.optimal_dtype of the
   vocabulary size), and both files must be equal byte for byte to tandem's.
The first document whose tokens differ is printed with both id lists (the diagnosis); the byte
comparison is the verdict. negative_control: one expected id is shifted; the check must fail.
Exact comparison throughout. A missing package fails the test: it never skips.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "..", "fixtures", "tokenizers")
sys.path.insert(0, os.path.join(HERE, "..", "hf"))
sys.path.insert(0, os.path.join(HERE, "..", "megatron"))
sys.path.insert(0, HERE)

CASES = {
    # name: (tandem's tokenizer options, how the oracle tokenizes)
    "gpt2_bpe": (["--tokenizer-type", "GPT2BPETokenizer",
                  "--vocab-file", os.path.join(FIXTURES, "gpt2-bpe", "vocab.json"),
                  "--merge-file", os.path.join(FIXTURES, "gpt2-bpe", "merges.txt")], "gpt2"),
    "gpt2_hf": (["--tokenizer-type", "HuggingFaceTokenizer",
                 "--tokenizer-model", os.path.join(FIXTURES, "gpt2-hf")], "auto"),
    "llama3_bpe": (["--tokenizer-type", "HuggingFaceTokenizer",
                    "--tokenizer-model", os.path.join(FIXTURES, "llama3-bpe")], "auto"),
}
CASES["gpt2_two_keys"] = (CASES["gpt2_bpe"][0] + ["--json-keys", "text", "title"], "gpt2")
CASES["negative_control"] = CASES["llama3_bpe"]


def json_keys(case):
    """The --json-keys a case builds (Megatron's default: text)."""
    options = CASES[case][0]
    return options[options.index("--json-keys") + 1:] if "--json-keys" in options else ["text"]


def lines():
    """The JSON Lines objects: every text under "text"; under "title", the texts in reverse order."""
    documents = texts()
    return [{"text": text, "title": title} for text, title in zip(documents, reversed(documents))]

WHITE_SPACE = [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680] + list(range(0x2000, 0x200B)) + \
    [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
NEAR_MISSES = [0x1C, 0x1D, 0x1E, 0x1F, 0x200B, 0x180E, 0xFEFF]


def category_samples():
    """Up to 6 characters of each general category (not surrogates, not unassigned), spread out."""
    by_category = {}
    for point in range(0x110000):
        category = unicodedata.category(chr(point))
        if category in ("Cs", "Cn"):
            continue
        by_category.setdefault(category, []).append(point)
    samples = {}
    for category, points in sorted(by_category.items()):
        step = max(1, len(points) // 6)
        samples[category] = [chr(p) for p in points[::step][:6]]
    return samples


def texts():
    """The documents: fixed hard cases, then seeded random strings; some as lists of pieces."""
    samples = category_samples()
    out = []
    for category, chars in samples.items():
        out.append(category + ": " + " ".join(chars) + " " + "".join(chars) + " x" + "".join(chars) + "9")
    spaces = "".join(chr(p) for p in WHITE_SPACE)
    out += [
        "runs: a" + spaces + "b " + spaces + " c" + "".join(chr(p) + "w" for p in WHITE_SPACE + NEAR_MISSES),
        "  leading and trailing  ", "\n\n\nnewlines\r\n\r\nwindows\n", "\t\ttabs\t \t", " ", "\u3000\u3000",
        "digits 0 12 123 1234 12345 1234567890 \u0663\u0664\u0665 \u2167 \u00bd 3.14159 1,234,567",
        "contractions it's IT'S we'll WE'LL they've THEY'VE I'm I'M you'd YOU'D don't DON'T 'S 's \u017f'\u017f",
        "'re're'RE' 'll'LL 'd'D 'm'M 'v'e 's's's",
        "emoji \U0001F600\U0001F680 \U0001F468\u200D\U0001F469\u200D\U0001F467 \U0001F44D\U0001F3FD "
        "\U0001F1E9\U0001F1EA \u2764\ufe0f #\ufe0f\u20e3",
        "scripts: Caf\u00e9 na\u00efve stra\u00dfe \u0434\u043e\u0431\u0440\u044b\u0439 \u4f60\u597d "
        "\u3053\u3093\u306b\u3061\u306f \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd "
        "\u0928\u092e\u0938\u094d\u0924\u0947 \ud55c\uad6d\uc5b4 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
        "combining e\u0301 a\u0308\u0304 \u1100\u1161\u11a8 zero\u200bwidth",
        "specials <|endoftext|> and <|begin_of_text|><|end_of_text|> x<|end_of_text|>y "
        "<|reserved_special_token_0|><|end_of_text|",
        "", "a", "the the the and and of", "x" * 300, " " * 40 + "y",
        ["a list ", "of pieces", "", " each tokenized apart"], ["", ""], [],
    ]
    rng = random.Random(20240613)
    pool = [c for chars in samples.values() for c in chars] + [chr(p) for p in WHITE_SPACE + NEAR_MISSES] + \
        list("abcdefghijklmnopqrstuvwxyzABC0123456789'  .,!?") * 3
    for _ in range(300):
        out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 40))))
    return out


def oracle(args):
    """Runs in the transformers venv: writes {vocab_size, eod, keys: {key: [[ids per piece]]}}."""
    with open(args.texts, encoding="utf-8") as stream:
        objects = [json.loads(line) for line in stream]
    tandem_options, how = CASES[args.case]
    if how == "gpt2":
        from tokenizers import Tokenizer, models, pre_tokenizers
        vocab, merges = tandem_options[3], tandem_options[5]
        tokenizer = Tokenizer(models.BPE.from_file(vocab, merges))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        with open(vocab, encoding="utf-8") as stream:
            encoder = json.load(stream)
        encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
        vocab_size, eod = len(encoder), encoder["<|endoftext|>"]
    else:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(tandem_options[3])
        encode = lambda text: tokenizer(text).input_ids  # noqa: E731
        vocab_size, eod = len(tokenizer), tokenizer.eos_token_id
    result = {"vocab_size": vocab_size, "eod": eod, "keys": {}}
    for key in json_keys(args.case):
        result["keys"][key] = []
        for line in objects:
            pieces = line[key] if isinstance(line[key], list) else [line[key]]
            result["keys"][key].append([encode(piece) for piece in pieces])
    with open(args.expected, "w") as stream:
        json.dump(result, stream)


def write_and_compare(args):
    """Runs in the megatron venv: writes Megatron's files for the oracle's ids, compares with tandem's."""
    import dataset_verdict
    import megatron_env
    import numpy
    modules = megatron_env.import_megatron()
    indexed = modules["indexed_dataset"]
    with open(args.expected) as stream:
        expected = json.load(stream)
    with open(args.texts, encoding="utf-8") as stream:
        objects = [json.loads(line) for line in stream]
    dtype = indexed.DType.optimal_dtype(expected["vocab_size"])
    verdict = 0
    for key in json_keys(args.case):
        documents = expected["keys"][key]
        if args.case == "negative_control":  # one id off must be caught
            first = next(d for d in documents if d and d[0])
            first[0][0] = (first[0][0] + 1) % expected["vocab_size"]
        name = "megatron_" + key
        builder = indexed.IndexedDatasetBuilder(os.path.join(args.work, name + ".bin"), dtype=dtype)
        expected_sequences = []  # per document: its sequences, as preprocess_data.py's encode() makes them
        for pieces in documents:
            doc_ids, lengths = [], []
            for ids in pieces:
                if ids:
                    doc_ids += ids
                    lengths.append(len(ids))
            if doc_ids:
                doc_ids.append(expected["eod"])
                lengths[-1] += 1
            builder.add_document(numpy.array(doc_ids, dtype=numpy.int64), lengths)
            sequences, start = [], 0
            for length in lengths:
                sequences.append(doc_ids[start:start + length])
                start += length
            expected_sequences.append(sequences)
        builder.finalize(os.path.join(args.work, name + ".idx"))
        verdict |= dataset_verdict.judge(indexed, args.work, expected_sequences, [line[key] for line in objects],
                                         "Hugging Face", dtype.__name__, args.case == "negative_control",
                                         tandem_name="tandem_%s_document" % key, megatron_name=name)
    return verdict


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tandem")
    parser.add_argument("--transformers-venv")
    parser.add_argument("--megatron-venv")
    parser.add_argument("--work", required=True)
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    parser.add_argument("--stage", default="main", choices=["main", "oracle", "compare"])
    args = parser.parse_args()
    args.work = os.path.abspath(os.path.join(args.work, args.case))
    args.texts = os.path.join(args.work, "docs.jsonl")
    args.expected = os.path.join(args.work, "expected.json")
    if args.stage == "oracle":
        return oracle(args)
    if args.stage == "compare":
        return write_and_compare(args)

    import megatron_env
    import transformers_env
    os.makedirs(args.work, exist_ok=True)
    with open(args.texts, "w", encoding="utf-8") as stream:
        for line in lines():
            stream.write(json.dumps(line) + "\n")
    command = [args.tandem, "data", "build", "--input", args.texts, "--output-prefix",
               os.path.join(args.work, "tandem")] + CASES[args.case][0]
    print("reproduce: " + " ".join(command))
    built = subprocess.run(command, capture_output=True, text=True)
    if built.returncode != 0:
        print("FAIL: tandem data build exited %d:\n%s%s" % (built.returncode, built.stdout, built.stderr))
        return 1
    common = [__file__, "--work", os.path.dirname(args.work), "--case", args.case]
    subprocess.run([transformers_env.ensure_venv(args.transformers_venv)] + common + ["--stage", "oracle"], check=True)
    return subprocess.run([megatron_env.ensure_venv(args.megatron_venv)] + common + ["--stage", "compare"]).returncode


if __name__ == "__main__":
    sys.exit(main())
