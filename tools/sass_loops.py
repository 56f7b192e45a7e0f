"""The innermost FMA loops of a CUDA unit's kernels, read from its SASS, without a GPU.

A kernel change that moves instructions out of a hot loop can be counted before it is timed:
this compiles one unit (the flags of the commands in maxsim_cuda/NOTES.md), disassembles it
with cuobjdump and prints, for every kernel, its registers and spills and each innermost loop
that holds floating-point FMAs (instructions, FFMA / DFMA, shared loads, the rest). With
--base REV the same unit is compiled from that revision too (a temporary git worktree) and the
two are printed side by side, kernel by kernel.

    python3 tools/sass_loops.py forward_fp32 --arch sm_90a --base HEAD

cuobjdump ships with a full CUDA toolkit; where only nvcc is installed,
`pip install nvidia-cuda-cuobjdump` provides it (found on PATH, beside nvcc, or through
$CUOBJDUMP).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NVCC_FLAGS = ["-O3", "-std=c++17", "-DCUDA_KERNEL", "-DENABLE_FP8", "--expt-relaxed-constexpr"]
FMA = re.compile(r"^(FFMA|DFMA)\b")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BACKWARD = re.compile(r"\bBRA\s+(?:\S+,\s*)?0x([0-9a-f]+)")


def find_cuobjdump() -> str:
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(str(Path(os.path.realpath(nvcc)).parent / "cuobjdump"))
    try:  # the pip wheel nvidia-cuda-cuobjdump
        import nvidia  # type: ignore
        for base in getattr(nvidia, "__path__", []):
            candidates += [str(p) for p in Path(base).glob("cu*/bin/cuobjdump")]
    except ImportError:
        pass
    for c in candidates:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    raise SystemExit("cuobjdump not found: set $CUOBJDUMP, or `pip install nvidia-cuda-cuobjdump`")


def compile_unit(tree: Path, unit: str, arch: str, out: Path) -> dict[str, tuple[int, int]]:
    """Compiles maxsim_cuda/<unit>.cu of `tree` to `out` (a cubin); returns ptxas's registers and
    spill-store bytes by mangled kernel name."""
    cmd = ["nvcc", *NVCC_FLAGS, f"-arch={arch}", f"-I{tree / 'maxsim_cuda'}", f"-I{tree / 'tools' / 'include'}",
           "-cubin", "-Xptxas", "-v", "-o", str(out), str(tree / "maxsim_cuda" / f"{unit}.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"nvcc failed in {tree}:\n{proc.stderr[-4000:]}")
    return ptxas_usage(proc.stderr)


def ptxas_usage(report: str) -> dict[str, tuple[int, int]]:
    usage, name, spill = {}, None, 0
    for line in report.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name, spill = m.group(1), 0
        m = re.search(r"(\d+) bytes spill stores", line)
        if m:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            usage[name] = (int(m.group(1)), spill)
            name = None
    return usage


def innermost_fma_loops(sass: str) -> dict[str, list[tuple[int, int, int]]]:
    """Per mangled kernel name, its innermost loops holding FMAs: (instructions, FMAs, shared
    loads). A loop is a backward branch and the instructions from its target to it; innermost:
    no other loop lies inside it."""
    loops = {}
    for block in re.split(r"\n\s*Function : ", sass)[1:]:
        name = block.split("\n", 1)[0].strip()
        body = [(int(a, 16), text) for a, text in INSTRUCTION.findall(block)]
        index = {addr: i for i, (addr, _) in enumerate(body)}
        spans = []
        for i, (addr, text) in enumerate(body):
            m = BACKWARD.search(text)
            if m and int(m.group(1), 16) < addr and int(m.group(1), 16) in index:
                spans.append((index[int(m.group(1), 16)], i))
        inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
        found = []
        for first, last in inner:
            ops = [re.sub(r"^@!?U?P\w+\s+", "", text) for _, text in body[first:last + 1]]
            fma = sum(1 for op in ops if FMA.match(op))
            if fma:
                found.append((len(ops), fma, sum(1 for op in ops if op.startswith("LDS"))))
        loops[name] = found
    return loops


def demangle(names: list[str]) -> dict[str, str]:
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return {n: re.sub(r"maxsim_cuda::(kernel::)?", "", d) for n, d in zip(names, out)}


def describe(tree: Path, unit: str, arch: str, work: Path, tag: str, cuobjdump: str):
    cubin = work / f"{tag}.cubin"
    usage = compile_unit(tree, unit, arch, cubin)
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return usage, innermost_fma_loops(sass)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("unit", help="a unit of maxsim_cuda/ without .cu, e.g. forward_fp32")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--base", help="a git revision to compare against (compiled from a temporary worktree)")
    args = ap.parse_args()
    cuobjdump = find_cuobjdump()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trees = {"tree": ROOT}
        if args.base:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(work / "base"),
                            args.base], check=True)
            trees = {"base": work / "base", "tree": ROOT}
        try:
            seen = {tag: describe(path, args.unit, args.arch, work, tag, cuobjdump) for tag, path in trees.items()}
        finally:
            if args.base:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / "base")])
    names = sorted({n for usage, _ in seen.values() for n in usage})
    pretty = demangle(names)
    for n in names:
        print(pretty[n])
        for tag, (usage, loops) in seen.items():
            regs, spill = usage.get(n, (0, 0))
            shown = ", ".join(f"{i} instructions ({f} FMA, {s} LDS, {i - f - s} other)" for i, f, s in loops.get(n, []))
            print(f"  {tag:5s} {regs:3d} registers, {spill} bytes spilled; loops: {shown or 'none with FMAs'}")


if __name__ == "__main__":
    sys.exit(main())
