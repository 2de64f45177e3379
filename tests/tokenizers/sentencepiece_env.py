"""The pinned sentencepiece and megatron-core that tests/tokenizers/check_sentencepiece.py checks with.

Usage: /usr/bin/python3 sentencepiece_env.py VENV
makes VENV (unless it is already complete) and prints the path of its python on the last line.

VENV is a virtual environment of Debian's /usr/bin/python3 that sees Debian's numpy and torch
(--system-site-packages) and holds, from PyPI with --no-deps: sentencepiece 0.2.0 (the Python
package Megatron's tokenizers call; a CPython 3.11 wheel) and megatron-core 0.16.1 (its SentencePiece
tokenizer library class and its IndexedDatasetBuilder; imported without megatron/core/__init__.py,
tests/megatron/megatron_env.py). Made once per build directory, under a lock, so parallel test runs
share it. A failure to install exits non-zero and the test fails: it never skips.
"""
import os
import sys

PACKAGES = ["sentencepiece==0.2.0", "megatron-core==0.16.1", "packaging"]
MARKER = "tandem-sentencepiece-0.2.0.ok"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import pinned_venv  # noqa: E402


def ensure_venv(venv):
    """Creates VENV with the pinned packages unless it is already complete; returns its python."""
    check = "import sys; sys.path.insert(0, %r); import sentencepiece_env; sentencepiece_env.import_megatron_sentencepiece()"
    return pinned_venv.ensure(venv, PACKAGES, MARKER, ["-c", check % HERE])


def import_megatron_sentencepiece():
    """Megatron Core's SentencePiece tokenizer library class and its dataset modules, without
    running megatron/core/__init__.py (megatron_env.import_megatron registers the bare packages)."""
    import importlib
    sys.path.insert(0, os.path.join(HERE, "..", "megatron"))
    import megatron_env
    modules = megatron_env.import_megatron()
    modules["sentencepiece_tokenizer"] = importlib.import_module(
        "megatron.core.tokenizers.text.libraries.sentencepiece_tokenizer")
    return modules


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: sentencepiece_env.py VENV")
    print(ensure_venv(sys.argv[1]))
