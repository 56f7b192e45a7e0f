"""Builds the Metal emulator: the maxsim_metal/*.metal kernels, the runner and the C ABI
(emu_ops.cpp) as a shared library for the tests, in one of three flavours:

  plain  -O1                      build/metal_emu/plain/libmaxsim_metal_emu.so
  asan   -fsanitize=address,undefined (load with LD_PRELOAD of libasan, see .ci/metal.sh)
  tsan   -fsanitize=thread, a standalone program running kernels on real threads
         (tools/metal_emu/tsan_main.cpp)     build/metal_emu/tsan/tsan_check

    python3 tools/metal_emu/build.py [plain|asan|tsan ...] [--kernel-dir DIR]

Rebuilds only when a source changed. --kernel-dir compiles the kernels from another
directory (the tests' barrier-removal check uses it on an edited copy).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
HERE = ROOT / "tools" / "metal_emu"

FLAVOURS = {
    "plain": ["-O1"],
    "asan": ["-O1", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
             "-fno-omit-frame-pointer"],
    "tsan": ["-O1", "-fsanitize=thread"],
}
# -U_FORTIFY_SOURCE: toolchains that fortify by default (Ubuntu's gcc) turn _longjmp into
# __longjmp_chk, which aborts on the jump from one fiber's stack to another.
# -fsigned-char: MSL's char is signed (int8 documents are `char`), as on x86-64 but not on
# every Linux target.
COMMON = ["-std=c++17", "-g", "-fPIC", "-ffp-contract=off", "-U_FORTIFY_SOURCE", "-fsigned-char",
          "-Wall", "-Wno-unused-variable", "-Wno-unused-function"]


def sources(kernel_dir: pathlib.Path) -> list[pathlib.Path]:
    # the self-test kernels (deliberate bugs the runner must report) ride along
    return (sorted(kernel_dir.glob("*.metal")) + sorted(kernel_dir.glob("*.h")) +
            [HERE / "selftest.metal"])


def fingerprint(paths, flags) -> str:
    h = hashlib.sha256(" ".join(flags).encode())
    for p in paths:
        h.update(str(p).encode())
        h.update(p.read_bytes())
    return h.hexdigest()


def build(flavour: str, kernel_dir: pathlib.Path, out_dir: pathlib.Path, jobs: int = 2) -> pathlib.Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / ("tsan_check" if flavour == "tsan" else "libmaxsim_metal_emu.so")
    inputs = sources(kernel_dir) + sorted((HERE / "include").iterdir()) + [
        HERE / "runtime.cpp", HERE / "emu_ops.cpp", HERE / "tsan_main.cpp", HERE / "prepass.py",
        ROOT / "maxsim_metal" / "launch_plan.h", ROOT / "maxsim_metal" / "params.h"]
    flags = COMMON + FLAVOURS[flavour]
    stamp = out_dir / "stamp"
    fp = fingerprint(inputs, flags)
    if target.exists() and stamp.exists() and stamp.read_text() == fp:
        return target
    gen = out_dir / "gen"
    subprocess.run([sys.executable, str(HERE / "prepass.py"), str(gen),
                    *map(str, sources(kernel_dir))], check=True)
    includes = [f"-I{HERE / 'include'}", f"-I{gen}", f"-I{ROOT}"]
    units = sorted(gen.glob("*.metal.cpp")) + [HERE / "runtime.cpp", HERE / "emu_ops.cpp"]
    if flavour == "tsan":
        units.append(HERE / "tsan_main.cpp")

    def compile_one(src: pathlib.Path) -> pathlib.Path:
        obj = out_dir / (src.name + ".o")
        subprocess.run(["g++", *flags, *includes, "-c", str(src), "-o", str(obj)], check=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        objs = list(pool.map(compile_one, units))
    link = ["g++", *flags, *map(str, objs), "-o", str(target), "-lpthread"]
    if flavour != "tsan":
        link.insert(1, "-shared")
    subprocess.run(link, check=True)
    stamp.write_text(fp)
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("flavours", nargs="*", default=["plain"], choices=sorted(FLAVOURS))
    ap.add_argument("--kernel-dir", type=pathlib.Path, default=ROOT / "maxsim_metal")
    ap.add_argument("--out", type=pathlib.Path, default=ROOT / "build" / "metal_emu")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MAXSIM_JOBS", "2")))
    args = ap.parse_args()
    for f in args.flavours:
        print(build(f, args.kernel_dir.resolve(), args.out / f, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
