#!/usr/bin/env python3
"""Fallback build for device checks when tools/build.py fails.

Compiles every .cpp/.cu of [kernel.cuda] plus a copy of torch-ext/torch_binding.cpp whose
dispatch keys are spelled c10::DeviceType::CPU/CUDA (torch 2.11's torch/library.h does not
bring torch::kCPU into scope). MAXSIM_STUB_CPU=1 replaces the CPU backend by cpu_stub.cpp.
"""
import concurrent.futures as futures
import os
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import build  # noqa: E402  (tools/build.py)

from torch.utils import cpp_extension  # noqa: E402
import torch  # noqa: E402

cfg = tomllib.load(open(ROOT / "build.toml", "rb"))
stub = os.environ.get("MAXSIM_STUB_CPU") == "1"
srcs = [s for s in cfg["kernel"]["cuda"]["src"] if s.endswith((".cu", ".cpp"))
        and not (stub and s.startswith("maxsim_cpu/"))]
if stub:
    srcs.append("tools/device/cpu_stub.cpp")
out = ROOT / "build" / "fallback"
out.mkdir(parents=True, exist_ok=True)
binding = (ROOT / "torch-ext/torch_binding.cpp").read_text()
binding = binding.replace("torch::kCPU", "c10::DeviceType::CPU").replace("torch::kCUDA", "c10::DeviceType::CUDA")
(out / "torch_binding_patched.cpp").write_text(binding)
srcs.append("build/fallback/torch_binding_patched.cpp")
nvcc = build.find_nvcc()
archs = os.environ.get("MAXSIM_CUDA_ARCHS", "9.0a").split(",")
inc = [ROOT / "tools/include", ROOT / "torch-ext", ROOT] + [Path(p) for p in cpp_extension.include_paths("cuda")]
inc += [Path(sysconfig.get_paths()["include"]), Path(nvcc).parent.parent / "include"]
incs = [f"-I{p}" for p in inc]
abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
defs = [f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DCUDA_KERNEL", "-DTORCH_EXTENSION_NAME=_maxsim_cuda_fallback",
        "-DPy_LIMITED_API=0x03090000"]


def comp(src):
    obj = out / (src.replace("/", "__") + ".o")
    if src.endswith(".cu"):
        cmd = [nvcc, "-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC", "-lineinfo",
               *build.gencode_flags(archs), *defs, *incs, "-c", str(ROOT / src), "-o", str(obj)]
    else:
        cmd = ["c++", "-O3", "-std=c++17", "-fPIC", "-fopenmp", "-ffp-contract=fast", *defs, *incs, "-c",
               str(ROOT / src), "-o", str(obj)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{src} failed:\n{r.stderr}")
    return obj


with futures.ThreadPoolExecutor(os.cpu_count()) as ex:
    objs = list(ex.map(comp, srcs))
lib = Path(torch.__file__).parent / "lib"
subprocess.run(["c++", "-shared", "-fopenmp", *map(str, objs), "-o", str(out / "_maxsim_cuda_fallback.so"), f"-L{lib}",
                "-lc10", "-ltorch", "-ltorch_cpu", "-lc10_cuda", "-ltorch_cuda",
                f"-L{Path(nvcc).parent.parent / 'lib64'}", "-lcudart"], check=True)
print(out / "_maxsim_cuda_fallback.so")
