#!/usr/bin/env python3
"""One entry point for the developer loop; the justfile and .ci/run call it.

    python3 tools/dev.py deps                 install what the tests/examples need
    python3 tools/dev.py build [--backend B]  no-Nix build (tools/build.py)
    python3 tools/dev.py test [pytest args]   deps + build + the test suite
    python3 tools/dev.py example N            deps + build + examples/N_*.py
    python3 tools/dev.py bench [args]         deps + build + `kernels benchmark .`
    python3 tools/dev.py cuda-compile         compile every CUDA unit for sm_80 and sm_90a (no GPU)

Each command installs and builds what it needs, so it works from a fresh clone.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HUB_ID = "maxsim/maxsim"
# The CPU build of torch this project is developed against; any torch >= 2.4 works.
TORCH_SPEC = os.environ.get("MAXSIM_TORCH_SPEC", "torch==2.13.0")


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=kw.pop("cwd", ROOT), **kw)


def pip_install(*specs: str) -> None:
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *specs])


def deps() -> None:
    if importlib.util.find_spec("torch") is None:
        pip_install(TORCH_SPEC)
    missing = [m for m in ("kernels", "pytest", "hypothesis", "numpy", "tabulate")
               if importlib.util.find_spec(m) is None]
    if missing:
        pip_install("-r", str(ROOT / "requirements-dev.txt"))


def build_all() -> None:
    import torch

    run([sys.executable, "tools/build.py", "--backend", "cpu"])
    if torch.version.cuda and torch.cuda.is_available():
        run([sys.executable, "tools/build.py", "--backend", "cuda"])


def user_env() -> dict[str, str]:
    """Environment under which get_kernel(HUB_ID, version=1) resolves to this checkout."""
    env = dict(os.environ)
    env["LOCAL_KERNELS"] = f"{HUB_ID}={ROOT}"
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def cuda_compile() -> None:
    """Compile every CUDA-backend unit for the oldest and newest targets; needs nvcc, no GPU.

    The .cu files are torch-free and go through nvcc for sm_80 and sm_90a; the tensor glue
    and the binding are checked by the host compiler against torch's CUDA headers.
    """
    import concurrent.futures as futures
    import sysconfig

    from torch.utils import cpp_extension

    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    cuda_home = Path(nvcc).resolve().parent.parent
    os.environ.setdefault("CUDA_HOME", str(cuda_home))
    cuda_include = cuda_home / "include"
    out = ROOT / "build" / ".cuda-compile"
    out.mkdir(parents=True, exist_ok=True)
    jobs = []
    for unit in sorted((ROOT / "maxsim_cuda").rglob("*.cu")):
        jobs.append([nvcc, "-std=c++17", "-O3", "--expt-relaxed-constexpr", f"-I{ROOT}",
                     "-gencode=arch=compute_80,code=sm_80",
                     "-gencode=arch=compute_90a,code=sm_90a",
                     "-c", str(unit), "-o", str(out / (unit.stem + ".o"))])
    includes = [f"-I{p}" for p in cpp_extension.include_paths()]
    # A CPU build of torch ships c10/cuda headers but not the one CMake generates for them.
    macros = Path(cpp_extension.include_paths()[0]) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not macros.exists():
        stub = out / "include" / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(f"-I{out / 'include'}")
    includes += [f"-I{ROOT}", f"-I{ROOT / 'tools' / 'include'}", f"-I{ROOT / 'torch-ext'}",
                 f"-I{cuda_include}", f"-I{sysconfig.get_paths()['include']}"]
    for unit in [ROOT / "maxsim_cuda" / "ops.cpp", ROOT / "torch-ext" / "torch_binding.cpp"]:
        jobs.append([os.environ.get("CXX", "c++"), "-std=c++17", "-fsyntax-only", "-DCUDA_KERNEL",
                     "-DTORCH_EXTENSION_NAME=_maxsim_cuda_check", "-DPy_LIMITED_API=0x03090000",
                     *includes, str(unit)])
    with futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for job in pool.map(lambda cmd: (run(cmd), cmd)[1], jobs):
            pass
    print(f"compiled {len(jobs)} CUDA-backend units")


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    command, rest = argv[0], argv[1:]
    if command == "deps":
        deps()
    elif command == "build":
        deps()
        run([sys.executable, "tools/build.py", *rest])
    elif command == "test":
        deps()
        build_all()
        run([sys.executable, "-m", "pytest", "tests", *rest], env=user_env())
    elif command == "example":
        deps()
        build_all()
        if not rest:
            raise SystemExit("usage: dev.py example N")
        matches = sorted((ROOT / "examples").glob(f"{int(rest[0]):02d}_*.py"))
        if not matches:
            raise SystemExit(f"no example numbered {rest[0]}")
        run([sys.executable, str(matches[0]), *rest[1:]], env=user_env())
    elif command == "bench":
        deps()
        build_all()
        run(["kernels", "benchmark", "./", *rest], env=user_env())
    elif command == "cuda-compile":
        cuda_compile()
    else:
        raise SystemExit(f"unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except subprocess.CalledProcessError as e:
        sys.exit(e.returncode)
