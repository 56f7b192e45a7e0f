"""float32 embeddings under torch.set_float32_matmul_precision: GPU time (CUDA-event median of
eager calls) of the compute-bound workloads with float32 inputs under "highest" and "medium",
beside the same inputs in bfloat16, and the largest score difference of "medium" from
"highest". Run on the device after a CUDA build:

    python3 tools/device/precision_bench.py
"""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import compare as C  # noqa: E402
import workloads as W  # noqa: E402


def main():
    kernel = C.load_kernel("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; ms per call (median of CUDA events)")
    for name in ("ColBERTCorpus", "ContrastiveD256", "ContrastiveD1024", "BigColBERT"):
        w = W.WORKLOADS[name]
        row = {}
        for label, dtype, precision in (("float32 highest", torch.float32, "highest"),
                                        ("float32 medium", torch.float32, "medium"),
                                        ("bfloat16", torch.bfloat16, "highest")):
            x = W.build_inputs(w, "cuda", dtype=dtype)
            torch.set_float32_matmul_precision(precision)
            fn = C.make_plain_impl("maxsim", x, kernel)
            row[label] = (C.time_ms(fn, "cuda", 3, 15), fn().float())
        torch.set_float32_matmul_precision("highest")
        diff = float((row["float32 medium"][1] - row["float32 highest"][1]).abs().max())
        print(f"{name:18s} " + "  ".join(f"{k} {v[0]:8.3f}" for k, v in row.items())
              + f"   max |medium - highest| {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
