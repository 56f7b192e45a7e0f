#!/usr/bin/env python3
"""The GPU checks and measurements of this repository, one entry point with subcommands.

Run on the GPU machine from the repository root, with .whl carried (the wheels of kernels,
tomlkit and the two peers, which `wheels` downloads here). For example, one device call each:

  python3 tools/device/cli.py suite --part 1/3        # then --part 2/3, --part 3/3
  python3 tools/device/cli.py suite --files tests/test_hopper.py -- -x
  python3 tools/device/cli.py sanitize
  python3 tools/device/cli.py bench compare           # the published tables' run
  python3 tools/device/cli.py bench compressed
  python3 tools/device/cli.py bench residual          # compare.py's residual-document rows
  python3 tools/device/cli.py ab --base .base         # A/B against a carried copy of a tree
  python3 tools/device/cli.py profile kernels split --ncu HeavyRerank-full:call:maxsim_forward
  python3 tools/device/cli.py script probe_small.py -- --shapes 5:1024 --sets 4
  python3 tools/device/cli.py harness timeline_bytes.cu --define MAXSIM_TIMELINE

Every subcommand but `wheels` and `harness` (a torch-free program: nvcc, then the binary) first sources tools/device/setup.sh (installs .whl/*.whl into
/tmp/site and puts it on PYTHONPATH; OUT defaults to /tmp/out), prints the GPU, and builds
the CUDA variant (setup.sh's build_cuda, log in $OUT/build.log) unless --no-build. --archs
picks the CUDA targets (default 9.0a, the local card, except `bench compare`: `all`, the
list build.toml gives a release). Logs, JSON and CSV land in $OUT. --dry-run prints the
commands instead of running them. `<subcommand> --help` says more.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE = Path("tools/device")
HUB_ID = "maxsim/maxsim"
DRY_RUN = False

# benchmarks/compare.py workloads of the published tables, in two runs so that a call that
# runs out of time still returns the first JSON.
INFERENCE_WORKLOADS = (
    "SmallRerank,Rerank,HeavyRerank,LongDocStress,ColPaliRerank,SmallRerankPacked,RerankPacked,"
    "HeavyRerankPacked,LongDocStressPacked,ColPaliRerankPacked,ColBERTCorpus,ColPaliCorpus,"
    "RerankD256,RerankD512,RerankD768,RerankD1024,ContrastiveD256,ContrastiveD512,"
    "ContrastiveD768,ContrastiveD1024")
TRAINING_WORKLOADS = "Contrastive,LongDocs,BigBatch,ColPali,BigColBERT,DocDoc"
# `bench residual`: compare.py's residual-document rows, one run each (most wanted first), so
# that a call that runs out of time keeps the runs before: (JSON stem, workloads, --documents).
RESIDUAL_RUNS = (
    ("residual_single", "SingleQueryRerank", "plain,residual2,centroids"),
    ("residual_single_packed", "SingleQueryRerankPacked", "plain,residual2,centroids"),
    ("residual_heavy", "HeavyRerank", "plain,residual2"),
    ("residual_heavy_packed", "HeavyRerankPacked", "plain,residual2"),
    ("residual_colpali", "ColPaliRerank,ColPaliRerankPacked", "plain,residual2"),
    ("residual_nbits", "SingleQueryRerank", "plain,residual1,residual4"),
)
# `wheels`: what setup.sh installs on the GPU machine, and what bench compat needs beyond it.
BASE_WHEELS = ("kernels==0.17.2", "tomlkit==0.15.2", "late-interaction-kernels==0.4.5",
               "flash-maxsim==0.3.0")
COMPAT_WHEELS = (
    "pylate==1.6.0 colpali-engine==0.3.18 late-interaction-kernels==0.4.5 transformers==5.3.0 "
    "sentence-transformers==5.3.0 datasets==5.2.0 peft==0.18.1 accelerate==1.15.0 "
    "huggingface-hub==1.33.0 tokenizers==0.22.2 safetensors==0.8.0 scikit-learn==1.9.1 "
    "threadpoolctl==3.8.0 joblib==1.6.0 pandas==3.1.1 pyarrow==26.0.1 dill==0.4.1 "
    "multiprocess==0.70.19 xxhash==4.1.0 psutil==7.2.2 ujson==5.12.0 httpx==0.28.1 "
    "httpcore==1.0.9 h11 anyio sniffio certifi idna typer==0.29.2 shellingham==1.5.4 "
    "annotated-doc==0.0.7 narwhals==2.29.0 cloudpickle==3.1.2 click rich markdown-it-py mdurl "
    "pygments regex tqdm requests urllib3 charset-normalizer pyyaml filelock fsspec hf-xet "
    "packaging python-dateutil six tzdata scipy pillow").split()
WHEEL_PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
                  "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                  "--platform", "manylinux2014_x86_64", "--platform", "any"]


# ---- running things ------------------------------------------------------------------------

def out_dir() -> Path:
    return Path(os.environ.get("OUT", "/tmp/out"))


def run(cmd, *, env=None, log=None, tail=None, timeout=None, cwd=None) -> int:
    """Run cmd (a list, or a string for bash), print it, stream its output into $OUT/log and
    print the last `tail` lines (every line when tail is None); returns the exit status.
    timeout: seconds, through coreutils `timeout` (exit status 124 when it hits)."""
    if isinstance(cmd, str):
        cmd = ["bash", "-c", cmd]
    if timeout:
        cmd = ["timeout", str(timeout), *cmd]
    shown = " ".join(shlex.quote(str(c)) for c in cmd)
    print(f"+ {shown}" + (f"  > $OUT/{log}" if log else ""), flush=True)
    if DRY_RUN:
        return 0
    full_env = dict(os.environ, **(env or {}))
    sink = open(out_dir() / log, "w") if log else None
    kept = deque(maxlen=tail) if tail is not None else None
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=full_env, cwd=cwd or ROOT, text=True, errors="replace")
    for line in proc.stdout:
        if sink:
            sink.write(line)
            sink.flush()
        if kept is not None:
            kept.append(line)
        else:
            print(line, end="", flush=True)
    rc = proc.wait()
    if sink:
        sink.close()
    if kept:
        print("".join(kept), end="", flush=True)
    return rc


def note(status: int, what: str) -> int:
    print(f"{what}: {'ok' if status == 0 else f'FAILED (exit status {status})'}", flush=True)
    return status


def setup(args, *, build: bool = True, cpu: bool = False) -> int:
    """Source setup.sh (the carried wheels, PYTHONPATH, OUT), adopt its environment, print the
    GPU, and build the CUDA variant for args.archs (and the CPU variant where `cpu`) unless
    --no-build (which still builds a missing CPU variant where `cpu`). Returns the exit status."""
    if args.archs == "all":
        os.environ.pop("MAXSIM_CUDA_ARCHS", None)
    else:
        os.environ["MAXSIM_CUDA_ARCHS"] = args.archs
    build = build and not args.no_build
    os.environ["OUT"] = str(out_dir())   # setup.sh's default, for the bash steps too
    steps = ["source tools/device/setup.sh || exit 1"]
    if build:
        steps.append("build_cuda build.log || exit 1")
    if DRY_RUN:
        print(f"+ bash -c {shlex.quote('; '.join(steps))}  (MAXSIM_CUDA_ARCHS="
              f"{os.environ.get('MAXSIM_CUDA_ARCHS', '')})")
    else:
        with tempfile.NamedTemporaryFile(suffix=".env") as env_file:
            steps.append(f"env -0 > {env_file.name}")
            rc = subprocess.call(["bash", "-c", "; ".join(steps)], cwd=ROOT)
            if rc != 0:
                return note(rc, "setup.sh" + (" and the CUDA build" if build else ""))
            pairs = Path(env_file.name).read_bytes().decode().split("\0")
            os.environ.update(p.split("=", 1) for p in pairs if "=" in p)
        out_dir().mkdir(parents=True, exist_ok=True)
        subprocess.call(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm",
                         "--format=csv,noheader"])
    if build:
        serialised_mma_warnings()
    # The suite's CPU tests need the CPU variant: --no-build on a machine whose earlier call
    # built only CUDA (a bare build_cuda) still builds it, or every CPU test errors.
    if cpu and (build or not cpu_variant_built()):
        if (rc := run([sys.executable, "tools/build.py", "--backend", "cpu"], log="build_cpu.log", tail=3)) != 0:
            return note(rc, "CPU build")
    return 0


def cpu_variant_built() -> bool:
    return any((ROOT / "build").glob("torch*-cpu-*"))


def serialised_mma_warnings() -> None:
    """ptxas's C75xx warnings in the build log: it serialised wgmma instructions (look at the
    SASS after touching the sm_90a consumer loops)."""
    log = out_dir() / "build.log"
    if DRY_RUN or not log.exists():
        return
    found = re.findall(r"C75\d\d", log.read_text(errors="replace"))
    if found:
        counts = {c: found.count(c) for c in sorted(set(found))}
        print("ptxas serialised wgmma (C75xx warnings): " +
              ", ".join(f"{c} x{n}" for c, n in counts.items()), flush=True)


def test_env(ampere: bool = False, ampere_root: str | None = None) -> dict:
    env = {"MAXSIM_TEST_NO_BUILD": "1", "LOCAL_KERNELS": f"{HUB_ID}={ROOT}", "HF_HUB_OFFLINE": "1"}
    if ampere:
        env["MAXSIM_TEST_AMPERE"] = "1"
        if ampere_root:
            env["MAXSIM_TEST_AMPERE_ROOT"] = str((ROOT / ampere_root).resolve())
    return env


def ampere_build_cmd(root) -> list:
    """The Ampere variant test_cuda.py's Ampere test runs, built into ROOT/build, with all but
    two of the machine's cores (the tests running beside it keep those). The lent machines are
    Hopper cards, so the compute_80 code is compiled straight to sm_90 SASS ('8.0@9.0'): the
    sm_80+PTX build made the driver JIT every kernel the test touched, which on a fresh machine
    took more than 100 s of the call."""
    jobs = max(1, (os.cpu_count() or 4) - 2)
    return [sys.executable, ROOT / "tools" / "build.py", "--backend", "cuda", "--archs", "8.0@9.0",
            "--jobs", str(jobs), "--out", ROOT / root / "build"]


def parse_variants(specs):
    """['NAME', 'NAME=ENV=V,ENV2=V2'] -> [(NAME, {ENV: V, ...})]; none: [('default', {})]."""
    out = []
    for spec in specs or ["default"]:
        name, _, settings = spec.partition("=")
        env = dict(s.split("=", 1) for s in settings.split(",") if s) if settings else {}
        out.append((name, env))
    return out


# ---- suite ---------------------------------------------------------------------------------

def test_files(selected) -> list[str]:
    if selected:
        return list(selected)
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))


def collected_counts(files, env) -> dict[str, int]:
    """Tests per file, from pytest --collect-only on this machine (after the build, so the CUDA
    parametrisations are counted)."""
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                             "-p", "no:cacheprovider", *files], cwd=ROOT, capture_output=True,
                            text=True, env=dict(os.environ, **env))
    counts = dict.fromkeys(files, 0)
    for line in result.stdout.splitlines():
        if "::" in line:
            f = line.split("::", 1)[0]
            counts[f] = counts.get(f, 0) + 1
    return counts


def partition(counts: dict[str, int], parts: int) -> list[list[str]]:
    """The files in `parts` groups of about equal test counts (largest file first into the
    lightest group; ties by name), each group in file order. Deterministic for given counts."""
    groups = [[] for _ in range(parts)]
    load = [0] * parts
    for f in sorted(counts, key=lambda f: (-counts[f], f)):
        k = min(range(parts), key=lambda i: (load[i], i))
        groups[k].append(f)
        load[k] += counts[f]
    return [sorted(g) for g in groups]


def cmd_suite(args) -> int:
    """Build (CUDA for --archs, and CPU), then run the test suite on the GPU and the CPU with
    MAXSIM_TEST_AMPERE=1 (test_cuda.py then also builds the Ampere variant and runs it on
    this GPU, so the pre-Hopper code is exercised; --no-ampere skips that). That build takes
    minutes of device time: --ampere-behind build/ampere builds it while this call's tests run
    (leaving the Ampere test out), and a later call's `--ampere-root build/ampere --files
    tests/test_cuda.py -- -k ampere` only runs it (while the machine stays warm).

    The whole suite (~3,400 tests) does not fit one 600 s device call: run it in parts,
    --part 1/3, then 2/3, then 3/3 (files split by their collected test counts, computed the
    same way in every call), or name files with --files. Arguments after `--` go to pytest
    (e.g. -- -x -k hopper). When tests/test_cuda_compressed.py is among the files, the
    exhaustive check of the pre-sm_89 e4m3 widening (check_e4m3_widen.cu, every byte against
    the hardware conversion) runs first. --examples also runs examples 05 and 06 under
    torchrun on 2 GPUs. --gpu-only leaves out what CI runs on its CPU machine (the CPU backend's
    device tests, the MSL emulator's files). Log: $OUT/tests.log (tests_part1of3.log for a part)."""
    if (rc := setup(args, cpu=True)) != 0:
        return rc
    env = test_env(ampere=not args.no_ampere and not args.ampere_behind, ampere_root=args.ampere_root)
    files = test_files(args.files)
    behind = None
    if args.ampere_behind:  # the Ampere variant builds while this call's tests run
        cmd = ampere_build_cmd(args.ampere_behind)
        print("+ (behind the tests) " + " ".join(shlex.quote(str(c)) for c in cmd) + "  > $OUT/ampere_build.log",
              flush=True)
        if not DRY_RUN:
            with open(out_dir() / "ampere_build.log", "w") as sink:  # the child keeps its own handle
                behind = subprocess.Popen([str(c) for c in cmd], stdout=sink, stderr=subprocess.STDOUT, cwd=ROOT)
    if args.gpu_only:
        # CI runs the CPU backend's tests and the MSL emulator's on every commit
        env = dict(env, MAXSIM_TEST_BACKENDS="cuda")
        files = [f for f in files if not Path(f).name.startswith("test_metal_emulated")]
    log = "tests.log"
    if args.part:
        k, n = (int(x) for x in args.part.split("/"))
        if not 1 <= k <= n:
            raise SystemExit(f"--part {args.part}: want K/N with 1 <= K <= N")
        counts = collected_counts(files, env)
        groups = partition(counts, n)
        for i, g in enumerate(groups, 1):
            print(f"part {i}/{n}: {sum(counts[f] for f in g)} tests: {' '.join(g)}", flush=True)
        files, log = groups[k - 1], f"tests_part{k}of{n}.log"
    status = 0
    if "tests/test_cuda_compressed.py" in files and not args.no_e4m3_check:
        status |= note(run(["nvcc", "-std=c++17", "-I.", "--expt-relaxed-constexpr", "-arch=sm_90a",
                            "-o", "/tmp/check_e4m3", DEVICE / "check_e4m3_widen.cu"], tail=20)
                       or run(["/tmp/check_e4m3"]), "e4m3 widening check")
    if files:
        rc = run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *files,
                  *args.pytest_args], env=env, log=log, tail=25, timeout=args.timeout)
        status |= note(rc, f"pytest ({len(files)} files)")
    if args.examples:
        for example in ("examples/05_distributed_training.py", "examples/06_sharded_search.py"):
            rc = run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc-per-node", "2", example], env=test_env(),
                     log=Path(example).stem + ".log", tail=2)
            status |= note(rc, f"torchrun --nproc-per-node 2 {example}")
    if behind is not None:
        status |= note(behind.wait(), f"Ampere (compute_80 as sm_90) build into {args.ampere_behind}/build (for --ampere-root)")
    return status


# ---- sanitize ------------------------------------------------------------------------------

def cmd_sanitize(args) -> int:
    """Build, then compute-sanitizer on tools/device/sanitize_subset.py: every public entry
    point once per dtype on ragged inputs with odd sizes, empty segments and a bad pair id,
    with float, int8 and float8 documents, then the sm_90a kernel forced on the padded and
    packed calls. memcheck and racecheck by default (--tool picks one); a finding fails the
    run (--error-exitcode 9). Logs: $OUT/sanitize_<tool>.log."""
    if (rc := setup(args)) != 0:
        return rc
    status = 0
    for tool in (["memcheck", "racecheck"] if args.tool == "both" else [args.tool]):
        rc = run(["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                  DEVICE / "sanitize_subset.py"], log=f"sanitize_{tool}.log", tail=3,
                 timeout=args.timeout)
        status |= note(rc, f"compute-sanitizer {tool}")
    return status


# ---- bench ---------------------------------------------------------------------------------

def cmd_bench_compare(args) -> int:
    """Build (default: every arch build.toml lists, as a release), then benchmarks/compare.py:
    maxsim, naive PyTorch and the installed peers side by side, eager and GPU-only. Without
    --workloads, the published set in two runs (inference rows, then training rows:
    $OUT/bench_infer.json and bench_train.json; merge them for benchmarks/results/ and render
    with benchmarks/render_tables.py). --variant NAME=ENV=V[,ENV=V] runs the set once per
    variant (e.g. --variant hopper --variant mma.sync=MAXSIM_CUDA_FORCE_MMA_SYNC=1), into
    bench_<part>_<NAME>.json. Arguments after `--` go to compare.py (e.g. -- --documents int8)."""
    if (rc := setup(args)) != 0:
        return rc
    runs = [("bench", args.workloads)] if args.workloads else \
        [("bench_infer", INFERENCE_WORKLOADS), ("bench_train", TRAINING_WORKLOADS)]
    variants = parse_variants(args.variant)
    status = 0
    for name, workloads in runs:
        for vname, venv in variants:
            stem = name if len(variants) == 1 and not args.variant else f"{name}_{vname}"
            rc = run([sys.executable, "benchmarks/compare.py", "--device", "cuda", "--workloads",
                      workloads, "--iters", str(args.iters), "--warmup", str(args.warmup),
                      "--json", out_dir() / f"{stem}.json", *args.compare_args],
                     env=venv, log=f"{stem}.log", tail=0, timeout=args.timeout)
            status |= note(rc, f"compare.py {stem}")
            if not DRY_RUN:
                lines = (out_dir() / f"{stem}.log").read_text(errors="replace").splitlines()
                print("\n".join(l[:170] for l in lines if re.match(r"  [A-Za-z]", l)), flush=True)
    return status


def cmd_bench_residual(args) -> int:
    """Build, then benchmarks/compare.py's residual-document rows (ColBERTv2 / PLAID codes:
    maxsim, decompress-then-score, naive, late-interaction-kernels' residual and centroid
    kernels, beside the float16 row of the same documents), full layout, in the runs
    RESIDUAL_RUNS lists: $OUT/<stem>.json each."""
    if (rc := setup(args)) != 0:
        return rc
    status = 0
    for stem, workloads, documents in RESIDUAL_RUNS:
        rc = run([sys.executable, "benchmarks/compare.py", "--device", "cuda", "--workloads", workloads,
                  "--documents", documents, "--layout", "full", "--no-memory", "--iters", str(args.iters),
                  "--warmup", str(args.warmup), "--json", out_dir() / f"{stem}.json"],
                 log=f"{stem}.log", tail=0, timeout=args.timeout)
        status |= note(rc, f"compare.py {stem}")
        if not DRY_RUN:
            lines = (out_dir() / f"{stem}.log").read_text(errors="replace").splitlines()
            print("\n".join(l[:220] for l in lines if re.match(r"  [A-Za-z]", l)), flush=True)
    return status


def cmd_bench_compressed(args) -> int:
    """Build, then tools/device/bench_compressed.py: GPU time of int8 and float8 e4m3fn
    documents against float16 ones on the rerank, long-document, wide and corpus shapes, the
    bytes per second they read, and the copy rate. Log: $OUT/bench_compressed.log."""
    if (rc := setup(args)) != 0:
        return rc
    return note(run([sys.executable, DEVICE / "bench_compressed.py"], log="bench_compressed.log",
                    timeout=args.timeout), "bench_compressed.py")


def cmd_bench_compat(args) -> int:
    """maxsim.compat with PyLate and colpali-engine on the GPU (tools/device/compat_gpu.py):
    tests/test_compat.py and tests/integrations with the libraries required, then a PyLate
    Contrastive step and a score_multi_vector call timed through the libraries' torch path,
    late-interaction-kernels and maxsim. Needs the folders .whl/compat-1, compat-2, ... that
    `wheels --compat` makes, carried one per call: each call installs what it carries into
    the virtualenv build/compat-venv (kept on a warm machine). Log: $OUT/compat.log."""
    if (rc := setup(args)) != 0:
        return rc
    venv = ROOT / "build" / "compat-venv"
    folders = sorted((ROOT / ".whl").glob("compat-*"))
    if folders:
        if not (venv / "bin" / "python3").exists():
            run([sys.executable, "-m", "venv", "--system-site-packages", venv])
            # The device's python3 is itself a virtualenv (torch lives there): a nested venv's
            # system site is the base interpreter's, so point it at this one's packages too.
            import site
            inner = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
            (inner / "outer-venv.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        wheels = [str(w) for f in folders for w in sorted(f.glob("*.whl"))]
        run([venv / "bin" / "pip", "install", "-q", "--no-index", "--no-deps", *wheels], tail=5)
    if args.install_only:
        return 0
    python = venv / "bin" / "python3" if venv.exists() else Path(sys.executable)
    return note(run([python, DEVICE / "compat_gpu.py", *(["--no-tests"] if args.no_tests else []),
                     "--reps", str(args.reps)], log="compat.log", timeout=args.timeout),
                "compat_gpu.py")


def cmd_bench_distributed(args) -> int:
    """Scaling of maxsim.distributed on a machine with 2 GPUs (tools/device/distributed_bench.py
    under torchrun): a BigColBERT-sized training step and a ColBERTCorpus-sized sharded search,
    one rank's shapes and the 2-GPU global batch on 1 GPU, then 2 GPUs; the table goes to
    $OUT/scaling.md (raw: scaling.jsonl). The distributed tests and examples: `suite --files
    tests/test_distributed.py --examples`."""
    if (rc := setup(args)) != 0:
        return rc
    jsonl = out_dir() / "scaling.jsonl"
    if not DRY_RUN:
        jsonl.unlink(missing_ok=True)
    status = 0
    for gpus, units in ((1, ["1", "2"]), (2, ["2"])):
        rc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                  str(gpus), DEVICE / "distributed_bench.py", "--units", *units, "--json", jsonl],
                 env=test_env(), log=f"bench_{gpus}gpu.log", tail=20, timeout=args.timeout)
        status |= note(rc, f"distributed_bench.py on {gpus} GPU(s)")
    rc = run([sys.executable, DEVICE / "distributed_bench.py", "--report", jsonl], log="scaling.md")
    return status | note(rc, "scaling table")


# ---- ab ------------------------------------------------------------------------------------

def patched_tree(patch: Path, dest: Path) -> int:
    """A copy of this tree (its sources: no build outputs, carried wheels or other trees) with
    `patch` applied, at dest; returns the exit status."""
    print(f"+ copy of the tree with {patch} applied -> {dest}", flush=True)
    if DRY_RUN:
        return 0
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(
        "build", ".base", ".whl", ".git", ".venv", "__pycache__", ".pytest_cache"))
    path = str((ROOT / patch).resolve())
    cmd = ["git", "apply", path] if shutil.which("git") else ["patch", "-p1", "--forward", "-i", path]
    rc = subprocess.call(cmd, cwd=dest)
    return note(rc, f"{cmd[0]} {patch}") if rc != 0 else 0


def cmd_ab(args) -> int:
    """The working tree (candidate) against another tree (base: a copy of it at another
    commit, carried, e.g. `git worktree add .base HEAD~1` here and carry .base): both built
    for --archs (the base in the background), a correctness subset on the candidate (--tests,
    -k cuda), then the same overhead.py probes (--probe, default `kernels split`) in each tree,
    or with --group tools/device/ab_trees.py's calls (both trees in one process), and, with
    --ncu, Nsight Compute of the candidate's kernels as `profile --ncu` does.
    With --patch (repeatable; tools/device/candidates/*.patch): the working tree is the base
    and each patch makes a candidate, a copy of it with the patch applied (nothing to carry),
    all built side by side, the tests run in each candidate, every tree timed in one process;
    with --no-build a candidate tree an earlier call built on the machine is kept as it is.
    Logs: $OUT/probe_candidate.log, probe_base.log (or ab_GROUPS.log and .json)."""
    patches = [Path(p) for p in args.patch]
    if patches:
        trees = {p.stem: Path(tempfile.gettempdir()) / "ab_trees" / p.stem for p in patches}
        base = Path(".")
    else:
        trees = {"candidate": ROOT}
        base = Path(args.base)
        if not (ROOT / base / "tools" / "build.py").exists():
            raise SystemExit(f"--base {base}: no tools/build.py there (carry a copy of the other tree)")
    # the builds side by side (the wheels setup.sh installs first are the builds' too); the CPU
    # variant first when there are tests (some compare with the CPU backend)
    if args.no_tests:
        args.tests = []
    if (rc := setup(args, build=False, cpu=bool(args.tests))) != 0:
        return rc
    others = {"base": ROOT / base} if not patches else {}
    for name, patch in zip(trees, patches):
        if args.no_build and (trees[name] / "build").is_dir():
            print(f"+ {trees[name]}: kept from the last call (--no-build)", flush=True)
            continue  # a later call on the same machine: the candidate as built then
        if (rc := patched_tree(patch, trees[name])) != 0:
            return rc
        others[name] = trees[name]
    background = {}
    for name, tree in others.items():
        print(f"+ (cd {tree} && python3 tools/build.py --backend cuda) > /tmp/build_{name}.log &", flush=True)
        if not DRY_RUN:
            with open(f"/tmp/build_{name}.log", "w") as log:
                background[name] = subprocess.Popen([sys.executable, "tools/build.py", "--backend", "cuda"],
                                                    cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    if not args.no_build:
        if (rc := run([sys.executable, "tools/build.py", "--backend", "cuda"], log="build.log", tail=3)) != 0:
            return note(rc, "candidate build" if not patches else "base build")
        serialised_mma_warnings()
    def built(name: str) -> bool:
        proc = background.pop(name, None)
        if proc is None or proc.wait() == 0:
            return True
        print(Path(f"/tmp/build_{name}.log").read_text()[-3000:])
        return False

    status = 0
    keyword = ["-k", args.keyword] if args.keyword else []
    for name, tree in trees.items():  # the candidates' tests while the base may still build
        if not built(name):
            return note(1, f"{name} build")
        if patches and not DRY_RUN:  # the CPU variant the tests compare with: the base's
            for variant in (ROOT / "build").glob("torch*-cpu-*"):
                shutil.copytree(variant, tree / "build" / variant.name, dirs_exist_ok=True)
        if not args.tests:
            continue
        env = dict(test_env(), LOCAL_KERNELS=f"{HUB_ID}={tree}")
        log = "tests_candidate.log" if not patches else f"tests_{name}.log"
        status |= note(run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            *args.tests, *keyword], env=env, log=log, tail=4, timeout=args.timeout, cwd=tree),
                       f"{name} tests")
    if not built("base"):
        return note(1, "base build")
    if args.group:
        stem = "ab_" + args.group.replace(",", "_")
        named = [a for name, tree in trees.items() for a in ("--tree", f"{name}={tree}")] if patches else []
        status |= note(run([sys.executable, DEVICE / "ab_trees.py", "--base", base, *named, "--group", args.group,
                            "--rounds", str(args.rounds), "--json", out_dir() / f"{stem}.json"],
                           env=test_env(), log=f"{stem}.log", timeout=args.timeout),
                       f"ab_trees.py --group {args.group}")
    else:
        for name, cwd in (*trees.items(), ("base", ROOT / base)):
            print(f"== {name}", flush=True)
            status |= note(run([sys.executable, DEVICE / "overhead.py", *args.probe.split()], cwd=cwd,
                               log=f"probe_{name}.log"), f"probe {name}")
    for spec in args.ncu:
        status |= ncu_spec(spec, args)
    return status


# ---- profile -------------------------------------------------------------------------------

NCU_SECTIONS = ["SourceCounters", "WarpStateStats", "SpeedOfLight", "Occupancy", "LaunchStats",
                "InstructionStats", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis"]
NCU_SUMMARY = (r"Duration|Registers Per|Executed Ipc A|Issue Slots Busy|No Eligible|"
               r"Compute \(SM\) Thr|Memory Thr|DRAM Thr|Achieved Occupancy|Executed Instructions  ")


def ncu_spec(spec: str, args) -> int:
    """One --ncu SPEC, WORKLOAD[-LAYOUT[-FORMAT]]:once|call:KERNEL_REGEX: `once` = a forward
    and backward of a training workload, `call` = one forward call of a workload in a layout
    (full or ragged) with float or int8 / float8_e4m3fn documents, or with float32 / float64
    inputs (FORMAT float32: the FFMA mainloop); the kernels matching the
    regex are profiled (--launch-skip / --launch-count; --warm: caches not flushed, the first
    matching launch skipped). tools/device/sass_runs.py reads the .sass.csv.gz it leaves."""
    try:
        what, mode, kernel = spec.split(":")
    except ValueError:
        raise SystemExit(f"--ncu {spec}: want WORKLOAD[-LAYOUT[-FORMAT]]:once|call:KERNEL_REGEX")
    parts = what.split("-")
    name, layout, fmt = parts[0], (parts[1:2] or ["full"])[0], (parts[2:3] or [""])[0]
    probe = ["once", name] if mode == "once" else ["call", name, layout, *([fmt] if fmt else [])]
    tag = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{what}_{kernel}")
    rep = Path("/tmp") / tag
    # --warm: caches as a graph replay finds them (not flushed; overhead.py makes each call
    # twice, so skipping the first matching launch profiles one that follows the same kernel)
    skip = args.launch_skip if args.launch_skip is not None else (1 if args.warm else 0)
    cmd = ["ncu", "--clock-control", "none", *(["--cache-control", "none"] if args.warm else []),
           "-k", f"regex:{kernel}", "--launch-skip", str(skip), "--launch-count", str(args.launch_count),
           "-f", "-o", rep]
    if args.ncu_set == "full":
        cmd[1:1] = ["--set", "full"]
    else:
        cmd[1:1] = ["--import-source", "no", *[x for s in NCU_SECTIONS for x in ("--section", s)]]
    rc = run([*cmd, sys.executable, DEVICE / "overhead.py", *probe], log=f"{tag}.ncu.log", tail=0)
    if rc != 0:
        run(["tail", "-n", "5", out_dir() / f"{tag}.ncu.log"])
        return note(rc, f"ncu {tag}")
    run(f"ncu -i {rep}.ncu-rep --page details > $OUT/{tag}.details.txt 2>&1")
    if args.ncu_set != "full":
        # per-SASS-instruction counters (executed instructions, stall samples), readable without ncu
        run(f"ncu -i {rep}.ncu-rep --page source --csv --print-source sass | gzip > $OUT/{tag}.sass.csv.gz")
    print(f"== {tag}", flush=True)
    run(f"grep -E '{NCU_SUMMARY}' $OUT/{tag}.details.txt | head -24")
    return 0


def cmd_profile(args) -> int:
    """Build, then where the GPU time goes. MODE ... are tools/device/overhead.py's probes
    (default `kernels split` unless only --ncu is given): kernels (GPU time of one inference
    call per shape), split (forward / grad_q / grad_d of the training workloads), split_kernels
    (grad_d's kernels on BigColBERT and DocDoc, each one's time), rerank,
    train [profile], floor (host cost of the cheapest calls), ab ENV=V[,ENV=V] NAME:LAYOUT ...
    (knobs against the default, alternating replays in one process). --variant NAME=ENV=V[,..]
    runs the probes once per variant (e.g. --variant hopper --variant
    mma.sync=MAXSIM_CUDA_FORCE_MMA_SYNC=1): $OUT/probe_<NAME>.log. --ncu SPEC (repeatable)
    profiles kernels with Nsight Compute: details in $OUT/<tag>.details.txt and, with the
    default section set, per-SASS-instruction counters in <tag>.sass.csv.gz; --ncu-set full
    takes ncu's full set instead. Examples of SPEC: BigColBERT:once:maxsim_forward,
    HeavyRerank-full:call:maxsim_forward, HeavyRerank-full-int8:call:maxsim_forward,
    BigColBERT:once:'maxsim_forward|grad_'."""
    if (rc := setup(args)) != 0:
        return rc
    modes = args.modes or ([] if args.ncu else ["kernels", "split"])
    status = 0
    if modes:
        for name, env in parse_variants(args.variant):
            print(f"== {name}: {' '.join(modes)}", flush=True)
            status |= note(run([sys.executable, DEVICE / "overhead.py", *modes], env=env,
                               log=f"probe_{name}.log", timeout=args.timeout), f"probe {name}")
    for spec in args.ncu:
        status |= ncu_spec(spec, args)
    return status


def cmd_script(args) -> int:
    """Build, then one of tools/device's Python scripts (probe_small.py, probe_wide.py,
    probe_cold.py, repeat_bytes.py, ...) in setup.sh's environment, so that it imports the
    carried wheels (run bare, `import kernels` fails there), with the arguments after `--`.
    Log: $OUT/<script's stem>.log, its last lines printed."""
    script = DEVICE / args.script
    if script.suffix != ".py" or script.parent != DEVICE or not (ROOT / script).is_file():
        print(f"cli.py script: {args.script!r} is not a Python script in {DEVICE}", flush=True)
        return 2
    if (rc := setup(args)) != 0:
        return rc
    return note(run([sys.executable, script, *args.script_args], log=f"{script.stem}.log", tail=40,
                    timeout=args.timeout), args.script)


def cmd_harness(args) -> int:
    """Compile one of tools/device's torch-free CUDA harnesses (gather_ceiling.cu,
    pdl_placement.cu, timeline_bytes.cu, ...) with the package's flags and include paths plus
    each --define, for --arch, then run it once per --variant (NAME=ENV=V[,ENV=V]; default: once
    as it is). No package build and no wheels: the harnesses link only the CUDA runtime.
    --binary runs a carried build of it instead of compiling here (a harness that includes a
    kernel unit takes minutes of nvcc). Logs: $OUT/<stem>.nvcc.log, $OUT/<stem>.<variant>.jsonl."""
    source = DEVICE / args.harness
    if source.suffix != ".cu" or source.parent != DEVICE or not (ROOT / source).is_file():
        print(f"cli.py harness: {args.harness!r} is not a CUDA harness in {DEVICE}", flush=True)
        return 2
    binary = Path(args.binary) if args.binary else Path("/tmp") / source.stem
    if not args.binary:
        cmd = ["nvcc", "-O3", "-std=c++17", "-DCUDA_KERNEL", "-DENABLE_FP8", *(f"-D{d}" for d in args.define),
               "--expt-relaxed-constexpr", f"-arch=sm_{args.arch}", "-Imaxsim_cuda", "-Itools/include",
               f"-I{DEVICE}", "-o", binary, source]
        if (rc := note(run(cmd, log=f"{source.stem}.nvcc.log", tail=20), f"nvcc {source.name}")) != 0:
            return rc
    status = 0
    for name, env in parse_variants(args.variant):
        rc = run([binary], env=env, log=f"{source.stem}.{name}.jsonl", tail=12, timeout=args.timeout)
        status |= note(rc, f"{source.stem} ({name})")
    return status


# ---- wheels --------------------------------------------------------------------------------

def cmd_wheels(args) -> int:
    """Here, with network (not on the GPU machine): download the wheels the GPU machine lacks
    (Python 3.12, x86-64 Linux). Into .whl/: kernels, tomlkit and the peers, which setup.sh
    installs (carry .whl in every call). With --compat, also PyLate, colpali-engine and what
    importing them needs, for `bench compat`, packed into .whl/compat-1, compat-2, ... of at
    most 60 MiB each so that each fits one carry."""
    dest = ROOT / ".whl"
    dest.mkdir(exist_ok=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *WHEEL_PLATFORM]
    status = run([*pip, "-d", dest, *BASE_WHEELS])
    if not args.compat or status:
        return note(status, "wheels")
    with tempfile.TemporaryDirectory() as tmp:
        status = run([*pip, "--abi", "cp312", "--abi", "abi3", "--abi", "none", "-d", tmp,
                      *COMPAT_WHEELS])
        if status or DRY_RUN:
            return note(status, "compat wheels")
        limit, used, n = 60 << 20, 60 << 20, 0
        for wheel in sorted(Path(tmp).glob("*.whl"), key=lambda w: -w.stat().st_size):
            size = wheel.stat().st_size
            if used + size > limit:
                n, used = n + 1, 0
                shutil.rmtree(dest / f"compat-{n}", ignore_errors=True)
                (dest / f"compat-{n}").mkdir()
            shutil.move(str(wheel), dest / f"compat-{n}" / wheel.name)
            used += size
    run("du -sh .whl/compat-*")
    return 0


# ---- the parser ----------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(prog="python3 tools/device/cli.py", description=__doc__,
                                formatter_class=fmt)
    p.add_argument("--dry-run", action="store_true",
                   help="print the commands instead of running them (setup.sh and builds too)")
    sub = p.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def common(default_archs="9.0a"):
        c = argparse.ArgumentParser(add_help=False)
        c.add_argument("--archs", default=default_archs,
                       help=f"CUDA targets to build, e.g. 9.0a or 8.0,9.0a; `all` = build.toml's "
                       f"list (default: {default_archs})")
        c.add_argument("--no-build", action="store_true",
                       help="use what build/ holds (a warm machine keeps it between calls)")
        c.add_argument("--timeout", type=int, help="seconds for each long step (coreutils timeout)")
        return c

    def add(parent, name, fn, short, archs="9.0a"):
        q = parent.add_parser(name, parents=[common(archs)], help=short, description=fn.__doc__,
                              formatter_class=fmt)
        q.set_defaults(fn=fn)
        return q

    q = add(sub, "suite", cmd_suite, "build, then the test suite (whole, --files, or --part K/N)")
    q.add_argument("--files", nargs="+", metavar="FILE", help="test files to run (default: all)")
    q.add_argument("--part", metavar="K/N", help="run part K of N (files split by test counts)")
    q.add_argument("--no-ampere", action="store_true",
                   help="leave MAXSIM_TEST_AMPERE unset (skips the Ampere variant's build and run)")
    q.add_argument("--ampere-behind", metavar="DIR",
                   help="build the Ampere variant into DIR/build while this call's tests run "
                   "(they then leave the Ampere test out), for a later call's --ampere-root DIR; "
                   "use an ignored path such as build/ampere, which a warm machine keeps")
    q.add_argument("--ampere-root", metavar="DIR",
                   help="the Ampere test runs the variant already in DIR/build instead of building it")
    q.add_argument("--no-e4m3-check", action="store_true",
                   help="skip check_e4m3_widen.cu when test_cuda_compressed.py is selected")
    q.add_argument("--examples", action="store_true",
                   help="also run examples 05 and 06 under torchrun on 2 GPUs")
    q.add_argument("--gpu-only", action="store_true",
                   help="the device tests on CUDA only (MAXSIM_TEST_BACKENDS=cuda) and no MSL-emulator "
                   "files: what CI, a CPU machine, cannot run")
    q.add_argument("pytest_args", nargs="*", metavar="-- PYTEST_ARGS", help="passed to pytest")

    q = add(sub, "sanitize", cmd_sanitize, "build, then compute-sanitizer on sanitize_subset.py")
    q.add_argument("--tool", choices=["both", "memcheck", "racecheck"], default="both")

    bench = sub.add_parser("bench", help="build, then a benchmark: compare, compressed, residual, "
                           "compat, distributed", description="Benchmarks on the GPU; `bench <name> --help`.")
    bsub = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    q = add(bsub, "compare", cmd_bench_compare, "benchmarks/compare.py, as the published tables",
            archs="all")
    q.add_argument("--workloads", help="comma-separated workloads, one run (default: the "
                   "published set in two runs)")
    q.add_argument("--iters", type=int, default=30)
    q.add_argument("--warmup", type=int, default=5)
    q.add_argument("--variant", action="append", metavar="NAME[=ENV=V,...]",
                   help="run once per variant with these environment settings (repeatable)")
    q.add_argument("compare_args", nargs="*", metavar="-- COMPARE_ARGS", help="passed to compare.py")
    add(bsub, "compressed", cmd_bench_compressed, "tools/device/bench_compressed.py")
    q = add(bsub, "residual", cmd_bench_residual, "benchmarks/compare.py's residual-document rows")
    q.add_argument("--iters", type=int, default=20)
    q.add_argument("--warmup", type=int, default=3)
    q = add(bsub, "compat", cmd_bench_compat, "maxsim.compat with PyLate / colpali-engine")
    q.add_argument("--no-tests", action="store_true", help="timings only")
    q.add_argument("--reps", type=int, default=20)
    q.add_argument("--install-only", action="store_true",
                   help="only install the carried .whl/compat-* into build/compat-venv")
    add(bsub, "distributed", cmd_bench_distributed, "scaling over 2 GPUs")

    q = add(sub, "ab", cmd_ab, "the working tree against another tree (A/B)")
    q.add_argument("--base", default=".base", help="the other tree, relative to the root "
                   "(default: .base)")
    q.add_argument("--patch", action="append", default=[], metavar="FILE",
                   help="instead of --base: a candidate made on the machine from this tree and the "
                   "patch (repeatable; tools/device/candidates/*.patch); this tree is then the base")
    q.add_argument("--tests", nargs="+", default=["tests/test_forward.py", "tests/test_argmax.py",
                                                 "tests/test_backward.py"],
                   help="correctness subset run on the candidate (with -k cuda)")
    q.add_argument("--no-tests", action="store_true", help="time only (e.g. a second call on the same builds)")
    q.add_argument("--keyword", default="cuda", help="the tests' pytest -k ('' for none)")
    q.add_argument("--probe", default="kernels split", help="overhead.py modes run in both trees")
    q.add_argument("--group", help="instead of the probes: tools/device/ab_trees.py's groups of calls "
                   "(comma-separated), GPU time of both trees alternating in one process ($OUT/ab_*.json)")
    q.add_argument("--rounds", type=int, default=3, help="ab_trees.py rounds (with --group)")
    add_ncu_options(q)

    q = add(sub, "profile", cmd_profile, "overhead.py probes and Nsight Compute of named kernels")
    q.add_argument("modes", nargs="*", metavar="MODE", help="overhead.py modes")
    q.add_argument("--variant", action="append", metavar="NAME[=ENV=V,...]",
                   help="run the probes once per variant (repeatable)")
    add_ncu_options(q)

    q = add(sub, "script", cmd_script, "build, then a tools/device script (probes) with its arguments")
    q.add_argument("script", metavar="SCRIPT", help="a file name in tools/device, e.g. probe_small.py")
    q.add_argument("script_args", nargs="*", metavar="-- ARGS", help="passed to the script")

    q = sub.add_parser("harness", help="compile and run a torch-free tools/device/*.cu harness",
                       description=cmd_harness.__doc__, formatter_class=fmt)
    q.add_argument("harness", metavar="HARNESS", help="a file name in tools/device, e.g. timeline_bytes.cu")
    q.add_argument("--define", action="append", default=[], metavar="NAME[=V]",
                   help="passed to nvcc as -DNAME[=V] (repeatable), e.g. MAXSIM_TIMELINE")
    q.add_argument("--arch", default="90a", help="nvcc's -arch=sm_ARCH (default: 90a)")
    q.add_argument("--binary", help="run this build of the harness (carried) instead of compiling")
    q.add_argument("--variant", action="append", metavar="NAME[=ENV=V,...]",
                   help="run once per variant with these environment settings (repeatable)")
    q.add_argument("--timeout", type=int, help="seconds for each run (coreutils timeout)")
    q.set_defaults(fn=cmd_harness)

    q = sub.add_parser("wheels", help="(here, with network) the wheels the GPU machine needs",
                       description=cmd_wheels.__doc__, formatter_class=fmt)
    q.add_argument("--compat", action="store_true", help="also the compat folders for bench compat")
    q.set_defaults(fn=cmd_wheels)
    return p


def add_ncu_options(q) -> None:
    q.add_argument("--ncu", action="append", default=[], metavar="SPEC",
                   help="WORKLOAD[-LAYOUT[-FORMAT]]:once|call:KERNEL_REGEX (repeatable)")
    q.add_argument("--ncu-set", choices=["hotspots", "full"], default="hotspots",
                   help="hotspots: source counters and stalls, exported per SASS instruction; "
                   "full: ncu --set full")
    q.add_argument("--launch-skip", type=int, default=None, help="default 0, or 1 with --warm")
    q.add_argument("--warm", action="store_true",
                   help="profile a launch with warm caches (ncu flushes them by default): an "
                   "instruction-fetch or L2 reading then matches what CUDA-graph timings see")
    q.add_argument("--launch-count", type=int, default=1)


def main(argv=None) -> int:
    global DRY_RUN
    argv = sys.argv[1:] if argv is None else list(argv)
    # Arguments after `--` belong to pytest / compare.py, whatever they look like.
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser().parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    for name in ("pytest_args", "compare_args", "script_args"):
        if hasattr(args, name):
            setattr(args, name, getattr(args, name) + extra)
    DRY_RUN = args.dry_run
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
