#!/usr/bin/env python3
"""No-Nix build: compiles exactly what build.toml lists and writes the layout kernel-builder
produces.

    build/torch<MM>-cxx11-<cpu|cuXYZ>-x86_64-linux/
        __init__.py ... (the package's .py files, flat)  _ops.py  metadata.json
        _maxsim_<backend>_<hash>.abi3.so

Usage: python tools/build.py [--backend cpu|cuda|metal|auto] [--archs 9.0a,8.0] [--jobs N]
                             [--compile-only [--no-spills]]

The sources are first copied into a staging folder that holds only the files build.toml
lists (the `src` of `[torch]` and of the backend's `[kernel.*]` tables); each table's
`include` folders are include paths inside that folder. So a header that is included but
not listed, or a listed file that is gone, fails here exactly as it fails kernel-builder's
release build, which generates its CMake from the same lists.

Flags follow kernel-builder: torch's COMMON_NVCC_FLAGS without the __CUDA_NO_HALF* defines
(plus -DENABLE_FP8) for nvcc, then each table's `cuda-flags` / `cxx-flags` on that table's
own sources. What this build adds on top (optimisation level, -fPIC, the limited-API and
ABI defines, the stand-in for kernel-builder's generated registration.h) is explained in
build.toml's header comment.

`--compile-only` compiles every listed unit and links nothing; it works with a CPU build of
torch, which is how CI checks the CUDA variant on a machine without CUDA libraries. With
`--no-spills` ptxas also reports each kernel's registers (-Xptxas -v, which changes no code),
and the build fails naming every kernel, unit and target that spills and is not in
tools/known_spills.txt, or that the list names for a compiled target and no longer spills.

The op namespace hashes every input of the build, so two different builds never
register ops under the same name, and an unchanged tree is not rebuilt.
Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
# build.toml's lists, the staging copy and the package layout, shared with build_metal.py.
from package_layout import (  # noqa: E402
    GENERATED_STANDIN, ROOT, Unit, kernel_tables, load_config, log, stage, system_includes,
    units_of, variant_name, write_package)

NVCC_DEFINES_KERNEL_BUILDER_DROPS = {
    "-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__",
}


def listed_files(config: dict) -> set[str]:
    """Every path any table of build.toml lists, whatever its backend."""
    files = set(config.get("torch", {}).get("src", []))
    for table in config.get("kernel", {}).values():
        files.update(table.get("src", []))
    return files


# What kernel-builder compiles or reads as a source; everything of these kinds under the
# backends' folders and torch-ext/ must be listed.
SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".mm", ".m", ".metal")


def manifest_problems(config: dict, root: Path = ROOT) -> list[str]:
    """Sources on disk that build.toml does not list, and listed files that do not exist."""
    listed = listed_files(config)
    on_disk = {
        p.relative_to(root).as_posix()
        for folder in [*root.glob("maxsim_*"), root / "torch-ext"] if folder.is_dir()
        for p in folder.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES
    }
    problems = [f"{f}: on disk but not listed in build.toml" for f in sorted(on_disk - listed)]
    problems += [f"{f}: listed in build.toml but does not exist" for f in sorted(listed)
                 if not (root / f).is_file()]
    return problems


def find_nvcc() -> str | None:
    """The nvcc of a CUDA toolkit folder (bin/nvcc beside include/cuda_runtime.h); a wrapper
    script elsewhere on PATH would hide where the toolkit's headers are."""
    candidates = [Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc"] if os.environ.get("CUDA_HOME") else []
    on_path = shutil.which("nvcc")
    candidates += [Path(on_path)] if on_path else []
    candidates += [Path("/usr/local/cuda/bin/nvcc"), Path("/usr/local/cuda-13.0/bin/nvcc")]
    for nvcc in candidates:
        for real in (nvcc, nvcc.resolve()):
            if real.exists() and (real.parent.parent / "include" / "cuda_runtime.h").exists():
                return str(real)
    return None


def choose_backend(requested: str) -> str:
    import torch

    if requested != "auto":
        return requested
    if torch.version.cuda and torch.cuda.is_available() and find_nvcc():
        return "cuda"
    if platform.system() == "Darwin" and torch.backends.mps.is_available():
        return "metal"
    return "cpu"


def gencode_flags(capabilities: list[str]) -> list[str]:
    """'8.0' -> SASS for sm_80; '8.0+PTX' also embeds PTX, which the driver compiles for
    newer GPUs; '8.0@9.0' compiles the compute_80 code (the Ampere code path, no wgmma) ahead
    of time into sm_90 SASS: what the driver's JIT makes of '8.0+PTX' on a Hopper card, without
    the minutes of JIT a fresh machine spends on it (how the Ampere path is tested there)."""
    flags = []
    for cap in capabilities:
        cap, _, run_on = cap.partition("@")
        num = cap.replace("+PTX", "").replace(".", "")
        if run_on:
            codes = f"sm_{run_on.replace('.', '')}"
        else:
            codes = f"[sm_{num},compute_{num}]" if cap.endswith("+PTX") else f"sm_{num}"
        flags.append(f"-gencode=arch=compute_{num},code={codes}")
    return flags


def torch_nvcc_flags() -> list[str]:
    from torch.utils import cpp_extension

    flags = [f for f in cpp_extension.COMMON_NVCC_FLAGS if f not in NVCC_DEFINES_KERNEL_BUILDER_DROPS]
    return flags + ["-DENABLE_FP8"]


KNOWN_SPILLS = ROOT / "tools" / "known_spills.txt"


def spill_problems(spilled: list[str], targets: list[str], known_file: Path = KNOWN_SPILLS) -> list[str]:
    """What --no-spills fails on: spills the list does not name, and listed spills of a compiled
    target that are gone (so the list stays the true one). Entries read 'unit: target kernel: ...'."""
    known = {line.strip() for line in known_file.read_text().splitlines()
             if line.strip() and not line.startswith("#")} if known_file.exists() else set()
    compiled = {f"sm_{t.split('@')[-1].replace('+PTX', '').replace('.', '')}" for t in targets}
    known_here = {k for k in known if k.split(": ", 1)[1].split(" ", 1)[0] in compiled}
    return ([f"spills (not in {known_file.name}): {s}" for s in sorted(set(spilled) - known_here)] +
            [f"no longer spills (remove it from {known_file.name}): {s}" for s in sorted(known_here - set(spilled))])


def spills_of(ptxas_report: str) -> list[str]:
    """'target kernel: N bytes spill stores, M bytes spill loads' for every kernel of a ptxas -v
    report that spills."""
    found, target, function = [], "?", "?"
    for line in ptxas_report.splitlines():
        if "Compiling entry function" in line and " for '" in line:
            target = line.rsplit(" for '", 1)[1].rstrip("'")
        elif "Function properties for " in line:
            function = line.split("Function properties for ", 1)[1].strip()
        elif "bytes spill stores" in line:
            stores, loads = (int(part.split()[0]) for part in line.split(",")[1:3])
            if stores or loads:
                found.append(f"{target} {function}: {stores} bytes spill stores, {loads} bytes spill loads")
    return found


def build(backend: str, archs: list[str] | None, jobs: int, out: Path,
          compile_only: bool = False, no_spills: bool = False) -> Path | None:
    import torch

    config = load_config()
    general = config["general"]
    if backend not in general["backends"]:
        raise SystemExit(f"build.toml lists no '{backend}' backend (has {general['backends']})")
    if backend == "metal":
        import build_metal  # macOS only: xcrun metal / metallib, clang++ for the .mm

        return build_metal.build(config, out)
    tables = kernel_tables(config, backend)
    files, units = units_of(config, backend)
    capabilities = archs or sorted({c for t in tables for c in t.get("cuda-capabilities", [])})

    nvcc = find_nvcc() if backend == "cuda" else None
    if backend == "cuda" and nvcc is None:
        raise SystemExit("the cuda backend needs nvcc (set CUDA_HOME)")
    if nvcc is not None:
        os.environ.setdefault("CUDA_HOME", str(Path(nvcc).parent.parent))

    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    defines = [
        "-DPy_LIMITED_API=0x03090000",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
        {"cpu": "-DCPU_KERNEL", "cuda": "-DCUDA_KERNEL"}[backend],
    ]
    cxx_base = ["-O3", "-std=c++17", "-fPIC", "-Wall", "-Wno-unknown-pragmas"]
    nvcc_base = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", *torch_nvcc_flags(),
                 *gencode_flags(capabilities)]

    digest = hashlib.sha256()
    for f in sorted(files):
        digest.update(f.encode())
        digest.update((ROOT / f).read_bytes() if (ROOT / f).is_file() else b"<missing>")
    for u in units:
        digest.update(" ".join([u.src, *u.includes, *u.cxx_flags, *u.cuda_flags]).encode())
    digest.update((GENERATED_STANDIN / "registration.h").read_bytes())
    digest.update(" ".join(defines + cxx_base + nvcc_base + [torch.__version__]).encode())
    namespace = f"_maxsim_{backend}_{digest.hexdigest()[:7]}"

    variant_dir = out / variant_name(backend) if not compile_only else None
    library = variant_dir / f"{namespace}.abi3.so" if variant_dir else None
    work = ROOT / "build" / ".obj" / (namespace + ("-compile-only" if compile_only else ""))
    staged = work / "src"
    ns_define = [f"-DTORCH_EXTENSION_NAME={namespace}"]

    if library is not None and library.exists():
        log(f"{library} is up to date")
    elif library is not None and (work / library.name).exists():  # built before, e.g. into another --out
        variant_dir.mkdir(parents=True, exist_ok=True)
        for stale in variant_dir.glob("*.so"):
            stale.unlink()
        shutil.copy2(work / library.name, library)
    else:
        stage(files, staged)
        sys_inc = [f"-I{p}" for p in system_includes(backend, nvcc, work / "sys-include")]

        def compile_one(u: Unit) -> Path:
            obj = work / (u.src.replace("/", "__") + ".o")
            includes = [f"-I{staged / inc}" for inc in u.includes] + [f"-I{GENERATED_STANDIN}"]
            if u.src.endswith(".cu"):
                cmd = [nvcc, *nvcc_base, *u.cuda_flags, *defines, *ns_define, *includes, *sys_inc,
                       *(["-Xptxas", "-v"] if no_spills else []), "-c", str(staged / u.src), "-o", str(obj)]
            else:
                cmd = [os.environ.get("CXX", "c++"), *cxx_base, *u.cxx_flags, *defines, *ns_define,
                       *includes, *sys_inc, "-c", str(staged / u.src), "-o", str(obj)]
            log(f"compile {u.src}")
            result = subprocess.run(cmd, capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"compiling {u.src} failed:\n{' '.join(cmd)}\n{result.stdout}{result.stderr}")
            if no_spills and u.src.endswith(".cu"):
                spilled.extend(f"{u.src}: {s}" for s in spills_of(result.stdout + result.stderr))
            return obj

        spilled: list[str] = []
        with futures.ThreadPoolExecutor(max_workers=jobs) as pool:
            objects = list(pool.map(compile_one, units))
        if compile_only:
            log(f"compiled {len(objects)} units of the {backend} variant "
                f"({', '.join(capabilities) if backend == 'cuda' else 'host'}); nothing linked")
            if no_spills:
                problems = spill_problems(spilled, capabilities)
                if problems:
                    raise SystemExit("register spills (ptxas -v):\n  " + "\n  ".join(problems))
                log(f"no kernel spills registers beyond the {len(spilled)} that {KNOWN_SPILLS.name} lists")
            return None

        torch_lib = Path(torch.__file__).parent / "lib"
        # -fopenmp: the objects call OpenMP through ATen's inline parallel_for (see build.toml).
        link = [os.environ.get("CXX", "c++"), "-shared", "-fopenmp", *map(str, objects), "-o",
                str(work / library.name), f"-L{torch_lib}", "-lc10", "-ltorch", "-ltorch_cpu"]
        if backend == "cuda":
            cuda_lib = Path(nvcc).parent.parent / "lib64"
            link += ["-lc10_cuda", "-ltorch_cuda", f"-L{cuda_lib}", "-lcudart"]
        log(f"link {library.name}")
        subprocess.run(link, check=True)
        if variant_dir.exists():
            shutil.rmtree(variant_dir)
        variant_dir.mkdir(parents=True)
        shutil.copy2(work / library.name, library)

    write_package(variant_dir, namespace, general, backend, capabilities)
    return variant_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda", "metal"])
    parser.add_argument("--archs", default=os.environ.get("MAXSIM_CUDA_ARCHS"),
                        help="comma-separated CUDA capabilities (default: build.toml's list)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", type=Path, default=ROOT / "build",
                        help="where the variant folder goes (default: build/)")
    parser.add_argument("--compile-only", action="store_true",
                        help="compile every listed unit, link nothing (CUDA check without CUDA libraries)")
    parser.add_argument("--no-spills", action="store_true",
                        help="with --compile-only: fail if ptxas reports a kernel that spills registers")
    args = parser.parse_args()
    if args.no_spills and not args.compile_only:
        parser.error("--no-spills goes with --compile-only")
    archs = [a.strip() for a in args.archs.split(",")] if args.archs else None
    backend = choose_backend(args.backend)
    result = build(backend, archs, args.jobs, args.out.resolve(), args.compile_only, args.no_spills)
    if result is not None:
        print(result)


if __name__ == "__main__":
    main()
