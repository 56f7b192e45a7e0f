#!/usr/bin/env python3
"""One entry point for the developer loop; the justfile and .ci/run call it.

    python3 tools/dev.py deps                 install what the tests/examples need
    python3 tools/dev.py build [--backend B]  no-Nix build (tools/build.py)
    python3 tools/dev.py test [pytest args]   deps + build + the test suite
    python3 tools/dev.py example N            deps + build + examples/N_*.py
    python3 tools/dev.py bench [args]         deps + build + `kernels benchmark .`
    python3 tools/dev.py cuda-compile         compile every unit build.toml lists for the CUDA
                                              variant, for sm_80 and sm_90a (nvcc, no GPU, no link),
                                              failing if any kernel spills registers

Each command installs and builds what it needs, so it works from a fresh clone. Inside an
active virtualenv or conda environment it installs there. Outside one, on an interpreter its
distribution marks externally managed (PEP 668: Debian's and Ubuntu's /usr/bin/python3), it
creates the git-ignored .venv/ in the checkout (seeing the system's site-packages, so a
preinstalled torch is reused), installs there and runs the command inside it. Any other
interpreter is used as it is; MAXSIM_DEV_VENV=1 asks for .venv/ anyway.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HUB_ID = "maxsim/maxsim"
# The CPU build of torch this project is developed against; any torch >= 2.4 works.
TORCH_SPEC = os.environ.get("MAXSIM_TORCH_SPEC", "torch==2.13.0")


PROJECT_VENV = ROOT / ".venv"


def in_managed_environment() -> bool:
    """An active virtualenv/venv or conda environment: the user chose where packages go."""
    return sys.prefix != sys.base_prefix or bool(os.environ.get("CONDA_PREFIX"))


def externally_managed() -> bool:
    return (Path(sysconfig.get_path("stdlib")) / "EXTERNALLY-MANAGED").exists()


def reexec_in_project_venv(argv: list[str]) -> None:
    """Run this same command with .venv's interpreter when installing here would be refused
    (or is unwanted); returns only when the current interpreter is the one to use."""
    if in_managed_environment():
        return
    if not (externally_managed() or os.environ.get("MAXSIM_DEV_VENV") == "1"):
        return
    python = PROJECT_VENV / "bin" / "python3"
    fresh = not python.exists()
    if fresh:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(PROJECT_VENV)],
                       check=True)
    why = "is externally managed" if externally_managed() else "was asked not to be used (MAXSIM_DEV_VENV=1)"
    print(f"dev.py: {sys.executable} {why}; {'created' if fresh else 'using'} the project "
          f"virtualenv {PROJECT_VENV.relative_to(ROOT)}/ and running there", flush=True)
    os.execv(str(python), [str(python), str(Path(__file__).resolve()), *argv])


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, cwd=kw.pop("cwd", ROOT), **kw)


def pip_install(*specs: str) -> None:
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", *specs])


def deps() -> None:
    if importlib.util.find_spec("torch") is None:
        pip_install(TORCH_SPEC)
    # tabulate and matplotlib come with kernels[benchmark]; matplotlib is for the benchmark
    # chart only (benchmarks/render_tables.py --chart), never for the package itself.
    missing = [m for m in ("kernels", "pytest", "hypothesis", "numpy", "tabulate", "matplotlib")
               if importlib.util.find_spec(m) is None]
    if missing:
        pip_install("-r", str(ROOT / "requirements-dev.txt"))


def build_all() -> None:
    import torch

    run([sys.executable, "tools/build.py", "--backend", "cpu"])
    if torch.version.cuda and torch.cuda.is_available():
        run([sys.executable, "tools/build.py", "--backend", "cuda"])
    if sys.platform == "darwin" and torch.backends.mps.is_available():
        run([sys.executable, "tools/build.py", "--backend", "metal"])


def user_env() -> dict[str, str]:
    """Environment under which get_kernel(HUB_ID, version=1) resolves to this checkout."""
    env = dict(os.environ)
    env["LOCAL_KERNELS"] = f"{HUB_ID}={ROOT}"
    env["HF_HUB_OFFLINE"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def cuda_compile() -> None:
    """Compile the CUDA variant's every listed unit through the release path (tools/build.py
    --compile-only: the staging copy of build.toml's list, kernel-builder's flags) for the
    oldest and newest targets; needs nvcc, no GPU, and links nothing, since a CPU build of
    torch has no CUDA libraries. A kernel that spills registers fails it (ptxas -v)."""
    run([sys.executable, "tools/build.py", "--backend", "cuda", "--compile-only", "--no-spills",
         "--archs", os.environ.get("MAXSIM_CUDA_ARCHS", "8.0,9.0a")])


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return
    command, rest = argv[0], argv[1:]
    reexec_in_project_venv(argv)
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
        beside = Path(sys.executable).parent / "kernels"  # the CLI of this environment's kernels
        run([str(beside) if beside.exists() else "kernels", "benchmark", "./", *rest], env=user_env())
    elif command == "cuda-compile":
        deps()
        cuda_compile()
    else:
        raise SystemExit(f"unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except subprocess.CalledProcessError as e:
        sys.exit(e.returncode)
