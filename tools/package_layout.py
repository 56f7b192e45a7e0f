"""What the no-Nix builds share (tools/build.py for cpu and cuda, tools/build_metal.py for
metal): reading build.toml's lists, the staging copy of exactly the listed files, the
include paths torch supplies, and the package layout `kernels` loads:

    build/<variant>/
        __init__.py ... (the package's .py files, flat)  _ops.py  metadata.json
        <op namespace>.abi3.so

Imports nothing from the build scripts, so both can import it.
"""
from __future__ import annotations

import json
import platform
import shutil
import sys
import sysconfig
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = ROOT / "torch-ext" / "maxsim"
# kernel-builder generates registration.h for the binding; this folder holds our copy of it.
GENERATED_STANDIN = ROOT / "tools" / "include"
COMPILED_SUFFIXES = (".cpp", ".cc", ".cu", ".mm")


def log(msg: str) -> None:
    print(f"[build] {msg}", file=sys.stderr, flush=True)


# ---- build.toml ----------------------------------------------------------------------------

def load_config() -> dict:
    with open(ROOT / "build.toml", "rb") as f:
        return tomllib.load(f)


def kernel_tables(config: dict, backend: str) -> list[dict]:
    return [k for k in config.get("kernel", {}).values() if k.get("backend") == backend]


@dataclass
class Unit:
    """One listed source as kernel-builder sees it: its include folders and extra flags."""
    src: str
    includes: list[str]
    cxx_flags: list[str] = field(default_factory=list)
    cuda_flags: list[str] = field(default_factory=list)


def units_of(config: dict, backend: str) -> tuple[list[str], list[Unit]]:
    """(every listed file of the variant, the compiled ones with their per-table settings)."""
    torch_table = config["torch"]
    tables = [(torch_table, True)] + [(t, False) for t in kernel_tables(config, backend)]
    files: list[str] = []
    units: dict[str, Unit] = {}
    for table, is_binding in tables:
        for src in table.get("src", []):
            if src not in files:
                files.append(src)
            if not src.endswith(COMPILED_SUFFIXES) or src in units:
                continue
            units[src] = Unit(src, list(table.get("include", [])),
                              [] if is_binding else list(table.get("cxx-flags", [])),
                              [] if is_binding else list(table.get("cuda-flags", [])))
    return files, list(units.values())


# ---- compiling -----------------------------------------------------------------------------

def stage(files: list[str], dest: Path) -> None:
    """Copy exactly the listed files into `dest` (nothing else is visible to the compiler)."""
    missing = [f for f in files if not (ROOT / f).is_file()]
    if missing:
        raise SystemExit("build.toml lists files that do not exist: " + ", ".join(missing))
    if dest.exists():
        shutil.rmtree(dest)
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)


def system_includes(backend: str, nvcc: str | None, scratch: Path) -> list[Path]:
    from torch.utils import cpp_extension

    paths = [Path(p) for p in cpp_extension.include_paths()]
    paths.append(Path(sysconfig.get_paths()["include"]))
    if backend == "cuda":
        paths.append(Path(nvcc).parent.parent / "include")
        # A CPU build of torch ships c10/cuda headers but not the one its CMake generates.
        macros = paths[0] / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
        if not macros.exists():
            stub = scratch / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
            stub.parent.mkdir(parents=True, exist_ok=True)
            stub.write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
            paths.append(scratch)
    return paths


# ---- the package kernels loads ---------------------------------------------------------------

def variant_name(backend: str) -> str:
    import torch

    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    arch = platform.machine()
    if backend == "cuda":
        cuda_tag = "cu" + torch.version.cuda.replace(".", "")
        return f"torch{major}{minor}-cxx11-{cuda_tag}-{arch}-linux"
    if backend == "metal":
        return f"torch{major}{minor}-metal-{arch}-darwin"
    return f"torch{major}{minor}-cxx11-cpu-{arch}-linux"


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
        backend_meta["archs"] = [c.split("@")[-1].replace("+PTX", "") for c in capabilities]
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
