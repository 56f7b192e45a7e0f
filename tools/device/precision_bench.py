"""float32 embeddings under torch.set_float32_matmul_precision, on the GPU: per workload and
setting ("highest", "high", "medium"), maxsim's time with float32 inputs beside the same inputs
in bfloat16 (the 16-bit kernel's time) and naive PyTorch (einsum + amax, which follows the same
setting through cuBLAS), eager (CUDA-event median) and GPU-only (CUDA-graph replay); and how far
each setting's scores are from float64 (largest |error| over the largest |score|). Run on the
device after a CUDA build:

    python3 tools/device/precision_bench.py [--json OUT.json] [--workloads A,B]
"""
import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import compare as C  # noqa: E402
import workloads as W  # noqa: E402

DEFAULT = ("ColBERTCorpus", "Contrastive", "ContrastiveD256", "ContrastiveD512", "ContrastiveD1024", "BigColBERT",
           "HeavyRerank", "Rerank")


def float64_scores(x):
    """The float64 answer of the workload's inference call (inference workloads only)."""
    t = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in x.t.items()}
    return W.naive_call(dataclasses.replace(x, dtype=torch.float64, t=t)).double()


def measure(fn, expected):
    eager = C.time_ms(fn, "cuda", 3, 15)
    g = C.graph_times(fn, 3, 15, expected, calls=C.graph_calls(eager))
    return eager, g["graph_ms"], g["graph_error"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--workloads", default=",".join(DEFAULT))
    args = ap.parse_args()
    kernel = C.load_kernel("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; ms per call: eager (CUDA-event "
          f"median) / GPU-only (graph replay); err = max |score - float64| / max |float64 score|")
    rows = []
    for name in args.workloads.split(","):
        w = W.WORKLOADS[name]
        x32 = W.build_inputs(w, "cuda", dtype=torch.float32)
        xb = W.build_inputs(w, "cuda", dtype=torch.bfloat16)
        ref = None
        try:
            ref = None if w.train else float64_scores(x32)
        except Exception as e:  # noqa: BLE001 - too large for float64 einsum: no error column
            print(f"  ({name}: no float64 reference: {C._reason(e)})")
        line = {"workload": name, "train": w.train}
        torch.set_float32_matmul_precision("highest")
        fn = C.make_plain_impl("maxsim", xb, kernel)
        line["bfloat16"] = measure(fn, fn().float())
        for precision in ("highest", "high", "medium"):
            torch.set_float32_matmul_precision(precision)
            for impl in ("maxsim", "naive"):
                try:
                    fn = C.make_plain_impl(impl, x32, kernel)
                    out = fn().float()
                    t = measure(fn, out)
                    err = None
                    if ref is not None:
                        err = float((out.double() - ref).abs().max() / ref.abs().max())
                    line[f"{impl} {precision}"] = (*t, err)
                except Exception as e:  # noqa: BLE001 - e.g. einsum out of memory
                    line[f"{impl} {precision}"] = (None, None, C._reason(e))
                torch.cuda.empty_cache()
        torch.set_float32_matmul_precision("highest")
        rows.append(line)
        parts = [f"{k} {v[0]:.3f}/{v[1] if v[1] is None else round(v[1], 3)}"
                 + (f" err {v[3]:.1e}" if len(v) > 3 and isinstance(v[3], float) else "")
                 for k, v in line.items() if isinstance(v, tuple) and v[0] is not None]
        print(f"{name:18s} " + " | ".join(parts), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name(),
                                               "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
