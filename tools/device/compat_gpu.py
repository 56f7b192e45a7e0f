"""maxsim.compat on a GPU: the adapter comparisons on CUDA, then a timing table.

Run through `python3 tools/device/cli.py bench compat [--no-tests]`, which installs PyLate
1.6.0, colpali-engine 0.3.18 and late-interaction-kernels from the carried .whl/compat-*
folders (`cli.py wheels --compat` downloads them) into build/compat-venv and runs this there.

(a) runs tests/test_compat.py and tests/integrations/ (the `device` fixture covers CUDA when
    a GPU is present) with MAXSIM_REQUIRE_INTEGRATIONS=1, so a missing library fails;
(b) times, with CUDA events (median of --reps calls after warm-up), in float32 under each
    torch.set_float32_matmul_precision setting and in bfloat16, one PyLate `Contrastive`
    training step (stub encoder, batch 64, Lq 32, Ld 180: forward + backward) and one
    `score_multi_vector` call (128 queries x 1,024 pages), through the library's torch path,
    through late-interaction-kernels (when installed; note it excludes padding, so its scores
    differ), and through maxsim (patched in).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "integrations"))
sys.path.insert(0, str(REPO / "benchmarks"))


def run_tests() -> int:
    env = dict(os.environ, MAXSIM_REQUIRE_INTEGRATIONS="1", HF_HUB_OFFLINE="1",
               LOCAL_KERNELS=f"maxsim/maxsim={REPO}")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_compat.py", "tests/integrations"]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=REPO, env=env)


def median_ms(fn, reps: int, warmup: int = 3) -> float:
    """CUDA-event-timed median, as benchmarks/compare.py times every workload."""
    from compare import time_ms

    return time_ms(fn, "cuda", warmup, reps)


def have_lik() -> bool:
    try:
        import late_interaction_kernels  # noqa: F401
    except ImportError:
        return False
    return True


def contrastive_step(ms, dtype, reps):
    """One PyLate Contrastive step: forward + backward through a stub encoder."""
    from pylate import losses
    from test_pylate_losses import StubEncoder, features

    gen = torch.Generator().manual_seed(0)
    model = StubEncoder(dtype, do_query_expansion=True).cuda()
    batch = [features(gen, 64, 32, "cuda"), features(gen, 64, 180, "cuda"),
             features(gen, 64, 180, "cuda")]
    loss = losses.Contrastive(model=model)

    def step():
        model.zero_grad(set_to_none=True)
        loss(batch).backward()

    return _modes(ms, "pylate", "PYLATE_SCORES_BACKEND", step, reps)


def multi_vector(ms, dtype, reps):
    from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor

    gen = torch.Generator().manual_seed(0)
    qs = [torch.randn(int(n), 128, generator=gen).to("cuda", dtype)
          for n in torch.randint(16, 33, (128,), generator=gen)]
    ps = [torch.randn(int(n), 128, generator=gen).to("cuda", dtype)
          for n in torch.randint(900, 1031, (1024,), generator=gen)]

    def call():
        BaseVisualRetrieverProcessor.score_multi_vector(qs, ps, device="cuda")

    return _modes(ms, "colpali_engine", "COLPALI_SCORES_BACKEND", call, reps)


def _modes(ms, library, env_name, fn, reps):
    results = {}
    saved = os.environ.get(env_name)
    try:
        os.environ[env_name] = "torch"
        results["torch"] = median_ms(fn, reps)
        if have_lik():
            os.environ[env_name] = "lik"
            try:
                results["LIK"] = median_ms(fn, reps)
            except Exception as error:  # e.g. a dtype LIK refuses: report, keep timing
                print(f"LIK failed: {type(error).__name__}: {error}", flush=True)
        os.environ[env_name] = "auto"
        getattr(ms, f"patch_{library}")()
        try:
            results["maxsim"] = median_ms(fn, reps)
        finally:
            getattr(ms, f"unpatch_{library}")()
    finally:
        if saved is None:
            os.environ.pop(env_name, None)
        else:
            os.environ[env_name] = saved
    return results


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-tests", action="store_true")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("compat_gpu.py needs a CUDA device")
        return 2
    status = 0 if args.no_tests else run_tests()

    import kernels

    import compat_semantics

    subprocess.check_call([sys.executable, str(REPO / "tools" / "build.py"), "--backend", "cuda"],
                          cwd=REPO)
    ms = kernels.get_local_kernel(REPO, backend="cuda")
    compat_semantics.hide_kernels_from_transformers()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"LIK {'installed' if have_lik() else 'not installed'}; ms, median of {args.reps}")
    print("| workload | dtype | matmul precision | torch | LIK | maxsim |")
    print("|---|---|---|---|---|---|")
    settings = [(torch.float32, "highest"), (torch.float32, "high"), (torch.float32, "medium"),
                (torch.bfloat16, "highest")]
    for name, fn in (("PyLate Contrastive step (B=64, Lq=32, Ld=180, fwd+bwd)", contrastive_step),
                     ("score_multi_vector (128 x 1,024 pages, Ld<=1030)", multi_vector)):
        for dtype, precision in settings:
            torch.set_float32_matmul_precision(precision)
            r = fn(ms, dtype, args.reps)
            cells = [f"{r[k]:.3f}" if k in r else "-" for k in ("torch", "LIK", "maxsim")]
            label = precision if dtype == torch.float32 else "-"
            print(f"| {name} | {str(dtype).split('.')[-1]} | {label} | " + " | ".join(cells) + " |",
                  flush=True)
    torch.set_float32_matmul_precision("highest")
    return status


if __name__ == "__main__":
    sys.exit(main())
