"""The pinned Hugging Face transformers that tests/export_hf_test.cpp checks `tandem export --hf` with.

Usage: /usr/bin/python3 transformers_env.py VENV
makes VENV (unless it is already complete) and prints the path of its python on the last line.

VENV is a virtual environment of Debian's /usr/bin/python3 that sees Debian's torch 1.13, numpy,
PyYAML and requests (--system-site-packages) and holds the packages below from PyPI, each pinned and
installed with --no-deps, so that pip never replaces Debian's torch or picks another version of
anything (transformers 4.44 works with torch 1.13; /work/shared/OUTSIDE-CHECKS.md). Made once per
build directory, under a lock, so parallel test runs share it. A failure to install exits non-zero
and the test fails: it never skips.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import pinned_venv  # noqa: E402

PACKAGES = [
    "transformers==4.44.2",
    "tokenizers==0.19.1",       # transformers' import checks its version
    "safetensors==0.4.5",       # model.safetensors, as tandem writes it
    "huggingface-hub==0.24.6",  # from_pretrained's file handling, also for a local directory
    "regex==2024.7.24",
    "tqdm==4.66.5",
    "filelock==3.15.4",
    "packaging==24.1",
    "fsspec==2024.6.1",
]
MARKER = "tandem-transformers-4.44.2.ok"
# What must import for the environment to count as complete.
IMPORT_CHECK = "import torch, safetensors, transformers; from transformers import LlamaForCausalLM"


def ensure_venv(venv):
    """Creates VENV with the pinned packages unless it is already complete; returns its python."""
    return pinned_venv.ensure(venv, PACKAGES, MARKER, ["-c", IMPORT_CHECK])


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: transformers_env.py VENV")
    print(ensure_venv(sys.argv[1]))
