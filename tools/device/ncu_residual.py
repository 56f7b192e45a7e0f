"""One residual rerank call (1 query x 1,000 candidates x 300 tokens, 2 bits) for ncu:
    ncu --metrics ... python3 tools/device/ncu_residual.py (see maxsim_cuda/NOTES.md).
RESIDUAL_F16_WEIGHTS=1 gives the codec float16 bucket weights (the kernels' 16-bit adds)."""
import os
import torch, kernels
from pathlib import Path
ms = kernels.get_local_kernel(Path('.'), backend="cuda")
g = torch.Generator(device="cuda").manual_seed(0)
D, C, Ld, Lq = 128, 1000, 300, 32
cents = torch.nn.functional.normalize(torch.randn(4096, D, device="cuda", generator=g), dim=-1).half()
weights = torch.linspace(-0.05, 0.05, 4, device="cuda")
if os.environ.get("RESIDUAL_F16_WEIGHTS") == "1":
    weights = weights.half()
codec = ms.ResidualCodec(cents, weights, 2)
q = torch.randn(1, Lq, D, device="cuda", generator=g).half()
codes = torch.randint(0, 4096, (1, C, Ld), device="cuda", generator=g)
res = torch.randint(0, 256, (1, C, Ld, 32), device="cuda", generator=g, dtype=torch.int32).to(torch.uint8)
ql = torch.full((1,), Lq, device="cuda"); dl = torch.full((1, C), Ld, device="cuda")
for _ in range(3):
    ms.score_candidates_padded(q, res, ql, dl, document_codes=codes, residual_codec=codec)
torch.cuda.synchronize()
