"""A virtual environment of Debian's python with pinned PyPI packages, for the checks against the
real thing (tests/hf, tests/megatron, tests/tokenizers; /work/shared/OUTSIDE-CHECKS.md).

ensure(venv, packages, marker, check) makes VENV with Debian's /usr/bin/python3, seeing Debian's
numpy and torch (--system-site-packages), installs `packages` from PyPI with --no-deps (so pip never
replaces a Debian package or picks another version of anything), runs `check` (arguments to the
venv's python) to prove the imports work, and only then writes `marker` into it: a half-made
environment is made again. Once per build directory, under a lock, so parallel test runs share it.
A failure raises, and the test that needs it fails: it never skips. Returns the venv's python.
"""
import fcntl
import os
import subprocess


def ensure(venv, packages, marker, check):
    venv = os.path.abspath(venv)
    python = os.path.join(venv, "bin", "python")
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(os.path.join(venv, marker)):
            return python
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps"] +
                       list(packages), check=True)
        subprocess.run([python] + list(check), check=True)
        open(os.path.join(venv, marker), "w").close()
    return python
