"""The pinned megatron-core a test checks tandem against, and how to import it here.

ensure_venv(DIR) makes DIR a virtual environment of Debian's /usr/bin/python3 that sees Debian's
numpy and torch (--system-site-packages) and holds megatron-core 0.16.1 from PyPI (--no-deps: it is
pure Python apart from its compiled dataset helpers, and its declared torch>=2.6 is not what
Debian ships). Made once per build directory, under a lock, so parallel ctest runs share it.
A failure to install raises: the tests that need it fail, they never skip.

import_megatron() imports only the dataset and scheduler modules, without running
megatron/core/__init__.py (which needs a newer torch): the packages are registered bare and
megatron.core.utils is a stand-in with the one function those modules use
(/work/shared/OUTSIDE-CHECKS.md).
"""
import logging
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import pinned_venv  # noqa: E402

MEGATRON_CORE = "megatron-core==0.16.1"
PACKAGING = "packaging"  # megatron.core's version checks import it
MARKER = "tandem-megatron-core-0.16.1.ok"


def ensure_venv(venv):
    """Creates VENV with the pinned megatron-core unless it is already complete; returns its python."""
    check = "import sys; sys.path.insert(0, %r); import megatron_env; megatron_env.import_megatron()"
    return pinned_venv.ensure(venv, [MEGATRON_CORE, PACKAGING], MARKER,
                              ["-c", check % os.path.dirname(os.path.abspath(__file__))])


def reexec_in_venv(venv):
    """Runs this script again under VENV's python unless it already runs there."""
    python = ensure_venv(venv)
    if os.path.realpath(sys.prefix) != os.path.realpath(venv):
        os.execv(python, [python] + sys.argv)


def import_megatron():
    """Imports megatron.core's dataset modules without megatron/core/__init__.py; returns them."""
    import importlib

    site = None
    for path in sys.path:
        if os.path.isdir(os.path.join(path, "megatron", "core", "datasets")):
            site = path
            break
    if site is None:
        raise RuntimeError("megatron-core is not installed in this interpreter (%s)" % sys.prefix)
    megatron = types.ModuleType("megatron")
    megatron.__path__ = [os.path.join(site, "megatron")]
    core = types.ModuleType("megatron.core")
    core.__path__ = [os.path.join(site, "megatron", "core")]
    utils = types.ModuleType("megatron.core.utils")

    def log_single_rank(logger, *args, rank=0, **kwargs):
        del rank
        logger.log(*args, **kwargs)

    utils.log_single_rank = log_single_rank
    sys.modules["megatron"] = megatron
    sys.modules["megatron.core"] = core
    sys.modules["megatron.core.utils"] = utils
    megatron.core = core
    core.utils = utils
    logging.getLogger("megatron").setLevel(logging.WARNING)
    modules = {}
    for name in ("helpers_cpp", "indexed_dataset", "gpt_dataset", "blended_dataset",
                 "blended_megatron_dataset_builder", "blended_megatron_dataset_config", "utils"):
        modules[name] = importlib.import_module("megatron.core.datasets." + name)
    return modules
