#!/usr/bin/env python3
"""No-Nix build: reads build.toml and writes the layout kernel-builder produces.

    build/torch<MM>-cxx11-<cpu|cuXYZ>-x86_64-linux/
        __init__.py ... (the package's .py files, flat)  _ops.py  metadata.json
        _maxsim_<backend>_<hash>.abi3.so

Usage: python tools/build.py [--backend cpu|cuda|auto] [--archs 9.0a,8.0] [--jobs N]

The op namespace hashes every input of the build, so two different builds never
register ops under the same name, and an unchanged tree is not rebuilt.
Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "torch-ext" / "maxsim"


def log(msg: str) -> None:
    print(f"[build] {msg}", file=sys.stderr, flush=True)


def load_config() -> dict:
    with open(ROOT / "build.toml", "rb") as f:
        return tomllib.load(f)


def kernel_tables(config: dict, backend: str) -> list[dict]:
    return [k for k in config.get("kernel", {}).values() if k.get("backend") == backend]


def variant_name(backend: str) -> str:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    arch = platform.machine()
    if backend == "cuda":
        cuda_tag = "cu" + torch.version.cuda.replace(".", "")
        return f"torch{major}{minor}-cxx11-{cuda_tag}-{arch}-linux"
    return f"torch{major}{minor}-cxx11-cpu-{arch}-linux"


def find_nvcc() -> str | None:
    for candidate in (
        os.environ.get("CUDA_HOME", "") and Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc",
        shutil.which("nvcc"),
        "/usr/local/cuda/bin/nvcc",
        "/usr/local/cuda-13.0/bin/nvcc",
    ):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def choose_backend(requested: str) -> str:
    import torch

    if requested != "auto":
        return requested
    if torch.version.cuda and torch.cuda.is_available() and find_nvcc():
        return "cuda"
    return "cpu"


def gencode_flags(capabilities: list[str]) -> list[str]:
    """'8.0' -> SASS for sm_80; '8.0+PTX' also embeds PTX, which the driver compiles for
    newer GPUs (how the Ampere code path is exercised on a Hopper card)."""
    flags = []
    for cap in capabilities:
        num = cap.replace("+PTX", "").replace(".", "")
        codes = f"[sm_{num},compute_{num}]" if cap.endswith("+PTX") else f"sm_{num}"
        flags.append(f"-gencode=arch=compute_{num},code={codes}")
    return flags


def sources_of(tables: list[dict], torch_src: list[str]) -> list[str]:
    seen, out = set(), []
    for src in torch_src + [s for t in tables for s in t.get("src", [])]:
        if src not in seen:
            seen.add(src)
            out.append(src)
    return out


def build(backend: str, archs: list[str] | None, jobs: int, out: Path) -> Path:
    import torch
    from torch.utils import cpp_extension

    config = load_config()
    general = config["general"]
    if backend not in general["backends"]:
        raise SystemExit(f"build.toml lists no '{backend}' backend (has {general['backends']})")
    tables = kernel_tables(config, backend)
    sources = sources_of(tables, config["torch"]["src"])
    compiled = [s for s in sources if s.endswith((".cpp", ".cu"))]
    capabilities = archs or sorted(
        {c for t in tables for c in t.get("cuda-capabilities", [])}
    )

    nvcc = find_nvcc() if backend == "cuda" else None
    if nvcc is not None:
        os.environ.setdefault("CUDA_HOME", str(Path(nvcc).resolve().parent.parent))
    include_dirs = [ROOT / "tools" / "include", ROOT / "torch-ext"]
    include_dirs += [ROOT / inc for t in tables for inc in t.get("include", [])]
    include_dirs += [Path(p) for p in cpp_extension.include_paths()]  # + nvcc's below
    include_dirs.append(Path(sysconfig.get_paths()["include"]))
    if backend == "cuda":
        if nvcc is None:
            raise SystemExit("the cuda backend needs nvcc (set CUDA_HOME)")
        include_dirs.append(Path(nvcc).parent.parent / "include")

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    defines = [
        "-DPy_LIMITED_API=0x03090000",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        "-DCPU_KERNEL" if backend == "cpu" else "-DCUDA_KERNEL",
    ]
    cxx_flags = ["-O3", "-std=c++17", "-fPIC", "-fopenmp", "-Wall", "-Wno-unknown-pragmas"]
    cxx_flags += [f for t in tables for f in t.get("cxx-flags", [])]
    nvcc_flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC",
                  "-lineinfo"] + gencode_flags(capabilities)
    nvcc_flags += [f for t in tables for f in t.get("cuda-flags", [])]

    digest = hashlib.sha256()
    for src in sorted(sources) + sorted(str(p) for p in (ROOT / "maxsim_cpu").rglob("*.h")) + sorted(
        str(p) for p in (ROOT / "maxsim_cuda").rglob("*.cuh")
    ):
        path = ROOT / src
        digest.update(str(src).encode())
        digest.update(path.read_bytes())
    digest.update(" ".join(defines + cxx_flags + nvcc_flags + [torch.__version__]).encode())
    namespace = f"_maxsim_{backend}_{digest.hexdigest()[:7]}"

    variant_dir = out / variant_name(backend)
    library = variant_dir / f"{namespace}.abi3.so"
    obj_dir = ROOT / "build" / ".obj" / namespace
    obj_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{p}" for p in include_dirs]
    ns_define = [f"-DTORCH_EXTENSION_NAME={namespace}"]

    if library.exists():
        log(f"{library} is up to date")
    elif (obj_dir / library.name).exists():  # built before, e.g. into another --out
        variant_dir.mkdir(parents=True, exist_ok=True)
        for stale in variant_dir.glob("*.so"):
            stale.unlink()
        shutil.copy2(obj_dir / library.name, library)
    else:
        def compile_one(src: str) -> Path:
            obj = obj_dir / (src.replace("/", "__") + ".o")
            if src.endswith(".cu"):
                cmd = [nvcc, *nvcc_flags, *defines, *ns_define, *includes, "-c", str(ROOT / src), "-o", str(obj)]
            else:
                cmd = [os.environ.get("CXX", "c++"), *cxx_flags, *defines, *ns_define, *includes,
                       "-c", str(ROOT / src), "-o", str(obj)]
            log(f"compile {src}")
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"compiling {src} failed:\n{' '.join(cmd)}\n{result.stdout}{result.stderr}")
            return obj

        with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            objects = list(pool.map(compile_one, compiled))

        torch_lib = Path(torch.__file__).parent / "lib"
        link = [os.environ.get("CXX", "c++"), "-shared", "-fopenmp", *map(str, objects), "-o",
                str(obj_dir / library.name), f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu"]
        if backend == "cuda":
            cuda_lib = Path(nvcc).parent.parent / "lib64"
            link += ["-lc10_cuda", "-ltorch_cuda", f"-L{cuda_lib}", "-lcudart"]
        log(f"link {library.name}")
        subprocess.run(link, check=True)
        if variant_dir.exists():
            shutil.rmtree(variant_dir)
        variant_dir.mkdir(parents=True)
        shutil.copy2(obj_dir / library.name, library)

    write_package(variant_dir, namespace, general, backend, capabilities)
    return variant_dir


def write_package(variant_dir: Path, namespace: str, general: dict, backend: str,
                  capabilities: list[str]) -> None:
    for stale in variant_dir.glob("*.py"):
        stale.unlink()
    for py in PACKAGE_DIR.glob("*.py"):
        shutil.copy2(py, variant_dir / py.name)
    (variant_dir / "_ops.py").write_text(
        "import torch\n"
        f"from . import {namespace}\n\n"
        f"ops = torch.ops.{namespace}\n\n\n"
        "def add_op_namespace_prefix(op_name: str) -> str:\n"
        f'    return f"{namespace}::{{op_name}}"\n'
    )
    backend_meta: dict = {"type": backend}
    if backend == "cuda":
        backend_meta["archs"] = [c.replace("+PTX", "") for c in capabilities]
    metadata = {
        "name": general["name"],
        "id": namespace,
        "version": general["version"],
        "license": general["license"],
        "python-depends": [],
        "backend": backend_meta,
    }
    (variant_dir / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    log(f"wrote {variant_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--archs", default=os.environ.get("MAXSIM_CUDA_ARCHS"),
                        help="comma-separated CUDA capabilities (default: build.toml's list)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", type=Path, default=ROOT / "build",
                        help="where the variant folder goes (default: build/)")
    args = parser.parse_args()
    archs = [a.strip() for a in args.archs.split(",")] if args.archs else None
    backend = choose_backend(args.backend)
    print(build(backend, archs, args.jobs, args.out.resolve()))


if __name__ == "__main__":
    main()
