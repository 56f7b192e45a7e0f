"""pytest plugin: run a library's own test files with maxsim patched in.

Loaded with `-p maxsim_patch_plugin` (this folder on PYTHONPATH) by .ci/integrations.sh,
which runs PyLate's and colpali-engine's tests from their release sdists. At start-up it loads
maxsim from this checkout's build/ (MAXSIM_REPO, default: the repository holding this file),
imports the library named by MAXSIM_PATCH (pylate or colpali_engine) and patches it, before
the test files import anything. At the end it fails the session when no score went through
maxsim, so a patch that silently stopped applying cannot pass.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(os.environ.get("MAXSIM_REPO", Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(REPO / "tests"))

import compat_semantics  # noqa: E402  (needs the path above)

_calls = {"n": 0}


def _count(api, name):
    original = getattr(api, name)

    def counted(*args, **kwargs):
        _calls["n"] += 1
        return original(*args, **kwargs)

    setattr(api, name, counted)


def pytest_configure(config):
    import importlib

    import kernels
    import torch

    backend = "cuda" if torch.cuda.is_available() else "cpu"
    ms = kernels.get_local_kernel(REPO, backend=backend)
    api = importlib.import_module(ms.__name__ + "._api")
    for name in dir(api):
        if name.startswith("score_"):
            _count(api, name)
    library = os.environ["MAXSIM_PATCH"]
    compat_semantics.hide_kernels_from_transformers()
    getattr(ms, f"patch_{library}")()
    config._maxsim_library = library


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _calls["n"] == 0:
        session.exitstatus = 1
        print(f"\nmaxsim_patch_plugin: no score went through maxsim while "
              f"{session.config._maxsim_library} was patched", file=sys.stderr)


def pytest_report_header(config):
    return f"maxsim patched into {os.environ.get('MAXSIM_PATCH')} (from {REPO})"


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"maxsim_patch_plugin: {_calls['n']} maxsim calls")
