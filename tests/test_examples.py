"""The single-process examples, run as their docstrings say (`tools/dev.py example N`): each in
its own interpreter, the kernel loaded through `kernels.get_kernel` from this checkout, on the
GPU where there is one, else on the CPU. Each example asserts what it shows (scores against a
reference, gradients, agreement with a decompressed index), so a run that exits 0 is a check.

Examples 05 and 06 need two processes (tests/test_distributed.py runs them under torchrun) and
07 needs PyLate and colpali-engine (.ci/integrations.sh runs it in that venv); the last test
keeps every example in one of the three lists, so a new one cannot go unrun.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import KERNEL_REPO, REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"
SINGLE_PROCESS = ["01_quickstart.py", "02_argmax_alignment.py", "03_contrastive_training.py",
                  "04_training_memory.py", "08_compressed_documents.py", "09_plaid_residual_rerank.py"]
UNDER_TORCHRUN = ["05_distributed_training.py", "06_sharded_search.py"]  # tests/test_distributed.py
WITH_INTEGRATIONS = ["07_pylate_colpali_switch.py"]  # .ci/integrations.sh


@pytest.mark.parametrize("example", SINGLE_PROCESS)
def test_example_runs(example, cpu_kernel, tmp_path):
    del cpu_kernel  # makes sure the build exists
    env = dict(os.environ, LOCAL_KERNELS=f"maxsim/maxsim={KERNEL_REPO}", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run([sys.executable, str(EXAMPLES / example)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_every_example_is_run_somewhere():
    listed = SINGLE_PROCESS + UNDER_TORCHRUN + WITH_INTEGRATIONS
    present = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert sorted(listed) == present, f"examples without a test: {sorted(set(present) - set(listed))}"
    integrations = (REPO_ROOT / ".ci" / "integrations.sh").read_text()
    assert all(f"examples/{name}" in integrations for name in WITH_INTEGRATIONS)
