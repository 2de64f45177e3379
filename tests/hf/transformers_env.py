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
import fcntl
import os
import subprocess
import sys

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
        subprocess.run([python, "-c", IMPORT_CHECK], check=True)
        open(os.path.join(venv, MARKER), "w").close()
    return python


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: transformers_env.py VENV")
    print(ensure_venv(sys.argv[1]))
