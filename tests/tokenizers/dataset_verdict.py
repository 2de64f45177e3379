"""The verdict of a tokenizer check (check_bpe.py, check_sentencepiece.py), in megatron-core's venv.

judge() reads tandem's dataset with Megatron's IndexedDataset and holds each document's sequences
to the oracle's (printing the first that differs), then tandem's .bin and .idx to the files
Megatron's IndexedDatasetBuilder wrote for the oracle's ids, byte for byte. Returns the exit
status: 0 when everything is equal; in the negative control (one expected id shifted) 0 only when
the difference was caught.
"""
import os


def judge(indexed, work, expected_sequences, documents, oracle, dtype_name, negative_control, verdict=0,
          tandem_name="tandem_text_document", megatron_name="megatron"):
    """tandem_name: the dataset `data build --output-prefix WORK/tandem` writes for one key
    (preprocess_data.py's WORK/tandem_KEY_document); megatron_name: the one written here."""
    tandem_prefix = os.path.join(work, tandem_name)
    megatron_prefix = os.path.join(work, megatron_name)
    tandem = indexed.IndexedDataset(tandem_prefix)
    bounds = tandem.document_indices.tolist()
    compared = 0
    for d, sequences in enumerate(expected_sequences):
        actual = [tandem[s].tolist() for s in range(bounds[d], bounds[d + 1])] if d + 1 < len(bounds) else None
        if actual != sequences:
            print("FAIL: document %d %r\n  expected (%s): %s\n  tandem:   %s" %
                  (d, documents[d], "shifted" if negative_control else oracle, sequences, actual))
            break
        compared += 1
    print("documents with equal tokens: %d of %d" % (compared, len(expected_sequences)))
    for suffix in (".bin", ".idx"):
        with open(megatron_prefix + suffix, "rb") as a, open(tandem_prefix + suffix, "rb") as b:
            left, right = a.read(), b.read()
        if left != right:
            first = next((i for i in range(min(len(left), len(right))) if left[i] != right[i]), min(len(left), len(right)))
            print("FAIL: %s differs from Megatron's IndexedDatasetBuilder's (%d vs %d bytes, first difference "
                  "at byte %d)" % (suffix, len(right), len(left), first))
            verdict = 1
        else:
            print("PASS: %s%s equals Megatron's IndexedDatasetBuilder's byte for byte (%d bytes, dtype %s)" %
                  (tandem_name, suffix, len(left), dtype_name))
    if negative_control:
        print("negative control: the shifted expectation was %s" % ("caught" if verdict else "NOT caught"))
        return 0 if verdict else 1
    return verdict
