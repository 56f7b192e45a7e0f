"""Small programs for the compressed-document diagnostics (tools/device/compressed_diagnose.sh).

  python3 tools/device/compressed_diagnose.py short_scales   # the bad call that crashed
  python3 tools/device/compressed_diagnose.py rerank int8|e4m3|fp16   # HeavyRerank x 3
"""
import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def ops():
    import kernels

    ms = kernels.get_local_kernel(ROOT, backend="cuda")
    return importlib.import_module(ms.__name__ + "._ops").ops


def short_scales(o):
    dev = torch.device("cuda")
    q = torch.randn(2, 8, 64, device=dev, dtype=torch.float16)
    v = torch.randint(-127, 128, (2, 3, 16, 64), device=dev, dtype=torch.int8)
    s = torch.rand(2 * 3 * 16, device=dev)
    ql = torch.tensor([8, 5], device=dev)
    dl = torch.full((2, 3), 16, device=dev)
    for name, scales in (("fresh short", torch.rand(95, device=dev)), ("view short", s[:-1])):
        try:
            o.padded_forward(q, v, ql, dl, False, scales)
            print(name, "no error", flush=True)
        except RuntimeError as e:
            print(name, "|", str(e).splitlines()[0], flush=True)


def rerank(o, fmt):
    sys.path.insert(0, str(ROOT / "tools" / "device"))
    from bench_compressed import padded_call

    calls, _ = padded_call(o, 32, 100, 32, 256, 128)
    fn = calls[fmt][0]
    for _ in range(3):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    o = ops()
    if sys.argv[1] == "short_scales":
        short_scales(o)
    else:
        rerank(o, sys.argv[2])
