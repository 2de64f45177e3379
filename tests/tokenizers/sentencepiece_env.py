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
import fcntl
import os
import subprocess
import sys

PACKAGES = ["sentencepiece==0.2.0", "megatron-core==0.16.1", "packaging"]
MARKER = "tandem-sentencepiece-0.2.0.ok"
HERE = os.path.dirname(os.path.abspath(__file__))


def ensure_venv(venv):
    """Creates VENV with the pinned packages unless it is already complete; returns its python."""
    venv = os.path.abspath(venv)
    python = os.path.join(venv, "bin", "python")
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(venv, MARKER)):
            return python
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        "--no-deps"] + PACKAGES, check=True)
        # Prove the imports work before marking the environment complete.
        subprocess.run([python, "-c", "import sys; sys.path.insert(0, %r); import sentencepiece_env; "
                        "sentencepiece_env.import_megatron_sentencepiece()" % HERE], check=True)
        open(os.path.join(venv, MARKER), "w").close()
    return python


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
