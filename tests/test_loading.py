"""Both ways users load the kernel, and what the loaded module exposes."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from conftest import KERNEL_BACKEND, KERNEL_REPO, PUBLIC_NAMES, load_kernel


def test_get_local_kernel_exposes_public_api(device):
    ms, dev = device
    backend = KERNEL_BACKEND[dev.type]
    missing = [name for name in PUBLIC_NAMES if not callable(getattr(ms, name, None))]
    assert not missing, missing
    assert set(PUBLIC_NAMES) <= set(ms.__all__)
    # The variant kernels picked: built for this backend, its library named by metadata's id.
    variant = Path(ms.__file__).parent
    meta = json.loads((variant / "metadata.json").read_text())
    assert meta["name"] == "maxsim" and meta["version"] == 1
    assert meta["backend"]["type"] == backend
    assert (variant / f"{meta['id']}.abi3.so").exists()
    assert variant.parent == KERNEL_REPO / "build"
    q = torch.ones(1, 1, 2, device=dev)
    d = torch.ones(1, 1, 1, 2, device=dev)
    one = torch.ones(1, 1, dtype=torch.int64, device=dev)
    assert ms.score_candidates_padded(q, d, one[0], one).item() == 2.0


def test_repeated_loads_return_the_same_module():
    import kernels
    assert kernels.get_local_kernel(KERNEL_REPO, backend="cpu") is load_kernel("cpu")


LOADER = textwrap.dedent("""
    import json, sys, torch, kernels
    ms = kernels.get_kernel("maxsim/maxsim", version=1, backend=sys.argv[2])
    q = torch.randn(2, 3, 8, device=sys.argv[1])
    d = torch.randn(2, 4, 5, 8, device=sys.argv[1])
    ql = torch.tensor([3, 1], device=sys.argv[1])
    dl = torch.tensor([[5, 1, 0, 2], [5, 5, 5, 5]], device=sys.argv[1])
    got = ms.score_candidates_padded(q, d, ql, dl)
    want = ms.score_candidates_padded_reference(q, d, ql, dl)
    print(json.dumps({"names": sorted(n for n in dir(ms) if not n.startswith("_")),
                      "file": ms.__file__,
                      "close": bool(torch.allclose(got, want, rtol=1e-5, atol=1e-5)),
                      "inf": bool(torch.isinf(got[0, 2]))}))
""")


def test_get_kernel_with_local_kernels_override(device, tmp_path):
    """kernels.get_kernel("maxsim/maxsim", version=1) resolved offline through LOCAL_KERNELS,
    in a fresh interpreter so the variables apply before `kernels` is imported."""
    _, dev = device  # makes sure the build exists
    env = dict(os.environ, LOCAL_KERNELS=f"maxsim/maxsim={KERNEL_REPO}", HF_HUB_OFFLINE="1",
               HF_HOME=str(tmp_path / "hf"))
    result = subprocess.run([sys.executable, "-c", LOADER, dev.type, KERNEL_BACKEND[dev.type]], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    info = json.loads(result.stdout.strip().splitlines()[-1])
    assert not set(PUBLIC_NAMES) - set(info["names"]), set(PUBLIC_NAMES) - set(info["names"])
    assert info["file"].startswith(str(KERNEL_REPO / "build")), info["file"]
    assert info["close"] and info["inf"]
