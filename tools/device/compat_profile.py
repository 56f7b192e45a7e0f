"""Where maxsim.compat.score_multi_vector's time goes on a GPU (128 queries x 1,024 pages,
bf16 and fp32): the torch profiler's top CUDA-time rows. Run from the repository root after
a CUDA build: python3 tools/device/compat_profile.py"""
import torch, kernels, sys
from pathlib import Path
ms = kernels.get_local_kernel(Path("."), backend="cuda")
g = torch.Generator().manual_seed(0)
for dt in (torch.bfloat16, torch.float32):
    qs = [torch.randn(int(n), 128, generator=g).to("cuda", dt) for n in torch.randint(16, 33, (128,), generator=g)]
    ps = [torch.randn(int(n), 128, generator=g).to("cuda", dt) for n in torch.randint(900, 1031, (1024,), generator=g)]
    for _ in range(2): ms.compat.score_multi_vector(qs, ps, device="cuda")
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as p:
        ms.compat.score_multi_vector(qs, ps, device="cuda"); torch.cuda.synchronize()
    print(dt); print(p.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=50))
