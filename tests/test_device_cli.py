"""tools/device/cli.py, the GPU machine's entry point, checked here without a GPU: every
subcommand's --help, how the suite is split into parts, and what the suite would run."""
from __future__ import annotations

import csv
import gzip
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, _load_source_module

CLI = _load_source_module("maxsim_device_cli", REPO_ROOT / "tools" / "device" / "cli.py")

SUBCOMMANDS = (["suite"], ["sanitize"], ["bench", "compare"], ["bench", "compressed"],
               ["bench", "residual"], ["bench", "compat"], ["bench", "distributed"], ["ab"], ["profile"], ["script"],
               ["harness"], ["wheels"])


@pytest.mark.parametrize("words", [[]] + [list(w) for w in SUBCOMMANDS], ids=" ".join)
def test_every_subcommand_has_help(words, capsys):
    with pytest.raises(SystemExit) as stop:
        CLI.main([*words, "--help"])
    assert stop.value.code == 0
    assert "usage: python3 tools/device/cli.py" in capsys.readouterr().out


def test_parts_cover_every_file_once_and_balance_the_test_counts():
    counts = {"tests/test_a.py": 900, "tests/test_b.py": 700, "tests/test_c.py": 400,
              "tests/test_d.py": 300, "tests/test_e.py": 5, "tests/test_f.py": 0}
    groups = CLI.partition(counts, 3)
    assert sorted(f for g in groups for f in g) == sorted(counts)
    loads = [sum(counts[f] for f in g) for g in groups]
    assert max(loads) - min(loads) <= 200
    assert all(g == sorted(g) for g in groups)
    assert CLI.partition(counts, 3) == groups                  # the same in every call
    assert CLI.partition(counts, 1) == [sorted(counts)]


def test_variants_parse_into_environment_settings():
    assert CLI.parse_variants(None) == [("default", {})]
    assert CLI.parse_variants(["hopper", "mma.sync=MAXSIM_CUDA_FORCE_MMA_SYNC=1,X=2"]) == [
        ("hopper", {}), ("mma.sync", {"MAXSIM_CUDA_FORCE_MMA_SYNC": "1", "X": "2"})]


def test_suite_passes_pytest_arguments_and_sets_the_ampere_build(monkeypatch):
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    seen = []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append((cmd, kw)) or 0)
    monkeypatch.setattr(CLI, "setup", lambda args, **kw: 0)
    assert CLI.main(["suite", "--files", "tests/test_hopper.py", "--timeout", "300", "--", "-x",
                     "-k", "hopper"]) == 0
    (cmd, kw), = seen
    assert cmd[-4:] == ["tests/test_hopper.py", "-x", "-k", "hopper"]
    assert kw["env"]["MAXSIM_TEST_AMPERE"] == "1" and kw["env"]["MAXSIM_TEST_NO_BUILD"] == "1"
    assert kw["timeout"] == 300 and kw["log"] == "tests.log"
    seen.clear()
    assert CLI.main(["suite", "--no-ampere", "--files", "tests/test_cuda_compressed.py"]) == 0
    assert [c[0][0] for c in seen[:2]] == ["nvcc", "/tmp/check_e4m3"]   # the e4m3 check first
    assert "MAXSIM_TEST_AMPERE" not in seen[-1][1]["env"]
    seen.clear()
    assert CLI.main(["suite", "--gpu-only", "--no-e4m3-check", "--files", "tests/test_hopper.py",
                     "tests/test_metal_emulated.py", "tests/test_metal_emulated_residual.py"]) == 0
    (cmd, kw), = seen
    assert kw["env"]["MAXSIM_TEST_BACKENDS"] == "cuda"
    assert [c for c in cmd if c.startswith("tests/")] == ["tests/test_hopper.py"]   # CI runs the emulator


def test_suite_builds_the_ampere_variant_behind_the_tests_and_runs_it_later(monkeypatch, tmp_path):
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    monkeypatch.setattr(CLI, "setup", lambda args, **kw: 0)
    monkeypatch.setattr(CLI, "out_dir", lambda: tmp_path)
    seen, started = [], []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append((cmd, kw)) or 0)

    class Build:  # the background build: started before the tests, waited for after them
        def __init__(self, cmd, **kw):
            started.append([str(c) for c in cmd])

        def wait(self):
            assert seen, "the build is waited for after the tests ran"
            return 0
    monkeypatch.setattr(CLI.subprocess, "Popen", Build)
    assert CLI.main(["suite", "--files", "tests/test_hopper.py", "--ampere-behind", "build/ampere"]) == 0
    (build,), ((cmd, kw),) = started, seen
    assert build[build.index("--archs") + 1] == "8.0@9.0" and build[-1] == str(CLI.ROOT / "build/ampere/build")
    assert "MAXSIM_TEST_AMPERE" not in kw["env"]          # the variant is not there yet
    seen.clear()
    assert CLI.main(["suite", "--ampere-root", "build/ampere", "--files", "tests/test_cuda.py", "--", "-k",
                     "ampere"]) == 0
    (cmd, kw), = seen
    assert kw["env"]["MAXSIM_TEST_AMPERE"] == "1"
    assert kw["env"]["MAXSIM_TEST_AMPERE_ROOT"] == str((CLI.ROOT / "build/ampere").resolve())


def test_ab_builds_both_trees_then_times_the_groups(monkeypatch, tmp_path):
    """ab: the base's build starts before the candidate's (side by side), the tests run with
    the keyword given ('' for none), and --group runs ab_trees.py's groups instead of the
    overhead.py probes."""
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    monkeypatch.setattr(CLI, "setup", lambda args, **kw: 0 if kw.get("build") is False else 1)
    monkeypatch.setattr(CLI, "serialised_mma_warnings", lambda: None)
    started = []

    class Build:
        def __init__(self, cmd, cwd, **kw):
            started.append((cmd, cwd))

        def wait(self):
            return 0
    monkeypatch.setattr(CLI.subprocess, "Popen", Build)
    monkeypatch.setattr(CLI, "out_dir", lambda: tmp_path)
    base = tmp_path / "base"  # the other tree: all ab needs of it here is its tools/build.py
    (base / "tools").mkdir(parents=True)
    (base / "tools" / "build.py").write_text("")
    seen = []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append([str(c) for c in cmd]) or 0)
    assert CLI.main(["ab", "--base", str(base), "--tests", "tests/test_hopper.py", "--keyword", "",
                     "--group", "epilogue,grad_documents", "--rounds", "2"]) == 0
    (base_cmd, base_cwd), = started
    assert base_cmd[-2:] == ["--backend", "cuda"] and base_cwd == base
    build, tests, ab = seen
    assert build[-3:] == ["tools/build.py", "--backend", "cuda"]
    assert tests[-1] == "tests/test_hopper.py" and "-k" not in tests
    assert ab[1].endswith("ab_trees.py") and ab[ab.index("--group") + 1] == "epilogue,grad_documents"
    assert ab[ab.index("--rounds") + 1] == "2"
    assert ab[ab.index("--json") + 1].endswith("ab_epilogue_grad_documents.json")
    assert not any("overhead.py" in c for cmd in seen for c in cmd)
    profiled = []
    monkeypatch.setattr(CLI, "ncu_spec", lambda spec, args: profiled.append(spec) or 0)
    seen.clear()
    assert CLI.main(["ab", "--base", str(base), "--no-build", "--group", "grad_queries",
                     "--ncu", "BigColBERT:once:grad_"]) == 0
    assert profiled == ["BigColBERT:once:grad_"]   # --group keeps the profiles asked for
    seen.clear()
    assert CLI.main(["ab", "--base", str(base), "--no-build"]) == 0   # probes; default -k cuda
    assert not any("tools/build.py" in c for cmd in seen for c in cmd)
    assert seen[0][-2:] == ["-k", "cuda"] and any("overhead.py" in c for c in seen[1])


def test_ab_with_patches_times_each_candidate_against_this_tree(monkeypatch, tmp_path):
    """ab --patch: this tree is the base, each patch a candidate tree made on the machine; the
    candidates build beside the base, their tests run in their own trees, and ab_trees.py
    times every tree in one process."""
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    monkeypatch.setattr(CLI, "setup", lambda args, **kw: 0)
    monkeypatch.setattr(CLI, "serialised_mma_warnings", lambda: None)
    made, started, seen = [], [], []
    monkeypatch.setattr(CLI, "patched_tree", lambda patch, dest: made.append((patch, dest)) or 0)

    class Build:
        def __init__(self, cmd, cwd, **kw):
            started.append(cwd)

        def wait(self):
            return 0
    monkeypatch.setattr(CLI.subprocess, "Popen", Build)
    monkeypatch.setattr(CLI, "out_dir", lambda: tmp_path)
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append(([str(c) for c in cmd], kw)) or 0)
    monkeypatch.chdir(tmp_path)  # the builds' logs
    assert CLI.main(["ab", "--patch", "tools/device/candidates/a.patch", "--patch", "x/b.patch",
                     "--tests", "tests/test_cuda.py", "--group", "tail_window_mma"]) == 0
    trees = [dest for _, dest in made]
    assert [p.name for p, _ in made] == ["a.patch", "b.patch"] and [t.name for t in trees] == ["a", "b"]
    assert started == trees   # the candidates build in the background, the base in front
    build, tests_a, tests_b, ab = seen
    assert build[0][-2:] == ["--backend", "cuda"] and build[1].get("cwd") is None
    for (cmd, kw), tree in ((tests_a, trees[0]), (tests_b, trees[1])):
        assert kw["cwd"] == tree and kw["env"]["LOCAL_KERNELS"].endswith(f"={tree}")
        assert cmd[-3:] == ["tests/test_cuda.py", "-k", "cuda"]
    cmd = ab[0]
    assert cmd[cmd.index("--base") + 1] == "."
    assert [cmd[i + 1] for i, c in enumerate(cmd) if c == "--tree"] == [f"a={trees[0]}", f"b={trees[1]}"]
    # a second call with --no-build keeps a candidate built by the first, makes the other
    monkeypatch.setattr(CLI.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / "ab_trees" / "a" / "build").mkdir(parents=True)
    made.clear(), started.clear(), seen.clear()
    assert CLI.main(["ab", "--no-build", "--no-tests", "--patch", "p/a.patch", "--patch", "p/b.patch",
                     "--group", "tail_window_mma"]) == 0
    assert [dest.name for _, dest in made] == ["b"] and [t.name for t in started] == ["b"]
    assert len(seen) == 1 and seen[0][0][1].endswith("ab_trees.py")   # no build, no tests


def test_patched_tree_copies_the_sources_and_applies_the_patch(monkeypatch, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "src" / "k.cuh").write_text("int a = 1;\n")
    (root / "build" / "big.so").write_text("x")
    (root / "c.patch").write_text("--- a/src/k.cuh\n+++ b/src/k.cuh\n@@ -1 +1 @@\n-int a = 1;\n+int a = 2;\n")
    monkeypatch.setattr(CLI, "ROOT", root)
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    assert CLI.patched_tree(Path("c.patch"), tmp_path / "c") == 0
    assert (tmp_path / "c" / "src" / "k.cuh").read_text() == "int a = 2;\n"
    assert (root / "src" / "k.cuh").read_text() == "int a = 1;\n"
    assert not (tmp_path / "c" / "build").exists()
    (root / "c.patch").write_text("--- a/src/k.cuh\n+++ b/src/k.cuh\n@@ -1 +1 @@\n-int a = 9;\n+int a = 2;\n")
    assert CLI.patched_tree(Path("c.patch"), tmp_path / "c") != 0   # a patch that no longer applies


def test_script_runs_a_device_script_after_setup_with_its_arguments(monkeypatch, capsys):
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    seen, setups = [], []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append((cmd, kw)) or 0)
    monkeypatch.setattr(CLI, "setup", lambda args, **kw: setups.append(args.no_build) or 0)
    assert CLI.main(["script", "probe_small.py", "--no-build", "--", "--shapes", "5:1024:30", "--sets", "4"]) == 0
    (cmd, kw), = seen
    assert [str(c) for c in cmd[1:]] == ["tools/device/probe_small.py", "--shapes", "5:1024:30", "--sets", "4"]
    assert kw["log"] == "probe_small.log" and setups == [True]
    seen.clear()
    for bad in ("nothing_here.py", "../compare.py", "gather_ceiling.cu"):   # refused before any setup
        assert CLI.main(["script", bad]) == 2
    assert not seen and setups == [True]
    assert "is not a Python script" in capsys.readouterr().out


def test_harness_compiles_with_the_defines_then_runs_each_variant(monkeypatch, capsys):
    monkeypatch.setattr(CLI, "DRY_RUN", False)
    seen = []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append((cmd, kw)) or 0)
    monkeypatch.setattr(CLI, "setup", lambda *a, **kw: pytest.fail("a harness needs no package build"))
    assert CLI.main(["harness", "timeline_bytes.cu", "--define", "MAXSIM_TIMELINE", "--variant", "pdl",
                     "--variant", "nopdl=MAXSIM_CUDA_PDL=0", "--timeout", "60"]) == 0
    (nvcc, nvcc_kw), (first, first_kw), (second, second_kw) = seen
    nvcc = [str(c) for c in nvcc]
    assert nvcc[0] == "nvcc" and "-DMAXSIM_TIMELINE" in nvcc and "-arch=sm_90a" in nvcc
    assert nvcc[-1] == "tools/device/timeline_bytes.cu" and nvcc[nvcc.index("-o") + 1] == "/tmp/timeline_bytes"
    assert nvcc_kw["log"] == "timeline_bytes.nvcc.log"
    assert [str(c) for c in first] == [str(c) for c in second] == ["/tmp/timeline_bytes"]
    assert (first_kw["env"], first_kw["log"], first_kw["timeout"]) == ({}, "timeline_bytes.pdl.jsonl", 60)
    assert (second_kw["env"], second_kw["log"]) == ({"MAXSIM_CUDA_PDL": "0"}, "timeline_bytes.nopdl.jsonl")
    seen.clear()
    assert CLI.main(["harness", "timeline_bytes.cu", "--binary", "build/timeline_bytes"]) == 0
    (cmd, kw), = seen   # a carried build: no nvcc
    assert [str(c) for c in cmd] == ["build/timeline_bytes"] and kw["log"] == "timeline_bytes.default.jsonl"
    seen.clear()
    for bad in ("nothing_here.cu", "../../maxsim_cuda/dispatch.cu", "probe_small.py"):   # refused, nothing run
        assert CLI.main(["harness", bad]) == 2
    assert not seen
    assert "is not a CUDA harness" in capsys.readouterr().out


def test_no_build_still_builds_a_missing_cpu_variant(monkeypatch):
    """suite --no-build on a machine where only the CUDA variant was built: the CPU one is
    built (the suite's CPU tests need it); where it exists, nothing is built."""
    monkeypatch.setattr(CLI, "DRY_RUN", True)
    seen = []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append(cmd) or 0)
    args = CLI.parser().parse_args(["suite", "--no-build"])
    for built in (False, True):
        seen.clear()
        monkeypatch.setattr(CLI, "cpu_variant_built", lambda: built)
        assert CLI.setup(args, cpu=True) == 0
        cpu_builds = [c for c in seen if c[-2:] == ["--backend", "cpu"]]
        assert len(cpu_builds) == (0 if built else 1), (built, seen)
    seen.clear()
    assert CLI.setup(args) == 0 and seen == []  # no CPU variant wanted: nothing built


def test_ncu_specs_name_a_probe_of_overhead_py(monkeypatch):
    seen = []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append(cmd) or 0)
    args = CLI.parser().parse_args(["profile", "--ncu", "x"])

    def profiled(spec):
        seen.clear()
        CLI.ncu_spec(spec, args)
        return [str(c) for c in seen[0]]

    ncu = profiled("HeavyRerank-ragged-int8:call:maxsim_forward")
    assert ncu[0] == "ncu" and "regex:maxsim_forward" in ncu and "SourceCounters" in ncu
    assert ncu[-5:] == ["tools/device/overhead.py", "call", "HeavyRerank", "ragged", "int8"]
    # float documents with the layout named: no format argument
    assert profiled("HeavyRerank-full:call:maxsim_forward")[-4:] == [
        "tools/device/overhead.py", "call", "HeavyRerank", "full"]
    assert profiled("HeavyRerank:call:maxsim_forward")[-3:] == ["call", "HeavyRerank", "full"]
    assert profiled("BigColBERT:once:maxsim_forward|grad_")[-2:] == ["once", "BigColBERT"]
    with pytest.raises(SystemExit):
        CLI.ncu_spec("BigColBERT:once", args)


def test_warm_profiles_keep_the_caches_and_skip_the_first_launch(monkeypatch):
    seen = []
    monkeypatch.setattr(CLI, "run", lambda cmd, **kw: seen.append(cmd) or 0)

    def ncu_args(*words):
        seen.clear()
        CLI.ncu_spec("SmallRerank-full:call:maxsim_forward", CLI.parser().parse_args(["profile", *words]))
        cmd = [str(c) for c in seen[0]]
        return cmd, cmd[cmd.index("--launch-skip") + 1]

    cold, skip = ncu_args("--ncu", "x")
    assert "--cache-control" not in cold and skip == "0"
    warm, skip = ncu_args("--ncu", "x", "--warm")
    assert warm[warm.index("--cache-control") + 1] == "none" and skip == "1"
    _, skip = ncu_args("--ncu", "x", "--warm", "--launch-skip", "3")
    assert skip == "3"


SASS_RUNS = _load_source_module("maxsim_sass_runs", REPO_ROOT / "tools" / "device" / "sass_runs.py")


def test_sass_runs_splits_the_executed_code_where_it_jumps_or_changes_count(tmp_path, capsys):
    header = ["Address", "Source", "# Samples", "Instructions Executed", "stall_no_inst", "stall_wait",
              "stall_no_inst (Not Issued)"]
    # instructions 0-3 run once each, 4-5 never (jumped over), 6-7 once, 8 three times
    counts = [1, 1, 1, 1, 0, 0, 1, 1, 3]
    rows = [[hex(0x7f00 + 16 * i), f"  {'@!P0 BRA' if i == 3 else 'IMAD'} R{i}", str(2 + i), str(c),
             str(i % 2), str(2 + i - i % 2), "0"] for i, c in enumerate(counts)]
    path = tmp_path / "k.sass.csv.gz"
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(header)
        w.writerows(rows)
    got = SASS_RUNS.summarise(*SASS_RUNS.read(str(path)), min_run=1)
    assert [(r.start, r.end, r.executed) for r in got["runs"]] == [(0, 3, 1), (6, 7, 1), (8, 8, 3)]
    assert got["instructions"] == 9 and got["executed"] == 7
    assert got["samples"] == sum(2 + i for i in range(9))
    assert got["stalls"]["stall_no_inst"] == 4 and "stall_no_inst (Not Issued)" not in got["stalls"]
    assert got["runs"][0].ops == {"BRA": 1, "IMAD": 3}
    assert [b[:2] for b in SASS_RUNS.summarise(*SASS_RUNS.read(str(path)), top=2)["busiest"]] == [(8, 10), (7, 9)]
    SASS_RUNS.main([str(path), "--top", "2"])
    out = capsys.readouterr().out
    assert "9 instructions, 7 executed (3 runs)" in out and "no_inst" in out


def test_run_streams_into_the_log_and_prints_the_tail(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OUT", str(tmp_path))
    rc = CLI.run("for i in 1 2 3 4; do echo line$i; done; exit 3", log="x.log", tail=2)
    assert rc == 3
    assert (tmp_path / "x.log").read_text() == "line1\nline2\nline3\nline4\n"
    out = capsys.readouterr().out
    assert "line3\nline4\n" in out and "line1" not in out.split("\n", 1)[1]


CANDIDATES = REPO_ROOT / "tools" / "device" / "candidates"


@pytest.mark.parametrize("patch", sorted(CANDIDATES.glob("*.patch")), ids=lambda p: p.name)
def test_kernel_candidates_still_apply_and_are_described(patch):
    """A kernel change kept for a GPU run must still apply to the tree it will be measured on,
    and its README row must say what it is predicted to do."""
    assert f"`{patch.name}`" in (CANDIDATES / "README.md").read_text(), f"{patch.name}: no row in README.md"
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout")
    r = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"{patch.name} no longer applies; rebase it or drop it:\n{r.stderr}"


BENCH = _load_source_module("maxsim_bench_compressed", REPO_ROOT / "tools" / "device" / "bench_compressed.py")


def test_knobs_restore_what_was_set_before(monkeypatch):
    """The device scripts' knob A/B (ab_trees, bench_compressed, overhead, probe_small,
    probe_wide) sets a call's environment and must leave the run's own settings as they were:
    a knob set before is restored, one that was unset is removed, also when the block raises."""
    monkeypatch.setenv("MAXSIM_CUDA_HOPPER_RESIDENT", "0")
    monkeypatch.delenv("MAXSIM_CUDA_FORCE_MMA_SYNC", raising=False)
    env = {"MAXSIM_CUDA_HOPPER_RESIDENT": "1", "MAXSIM_CUDA_FORCE_MMA_SYNC": "1"}
    with BENCH.knobs(env):
        assert {k: os.environ.get(k) for k in env} == env
    assert os.environ["MAXSIM_CUDA_HOPPER_RESIDENT"] == "0"
    assert "MAXSIM_CUDA_FORCE_MMA_SYNC" not in os.environ
    with pytest.raises(RuntimeError), BENCH.knobs(env):
        raise RuntimeError
    assert os.environ["MAXSIM_CUDA_HOPPER_RESIDENT"] == "0"
    assert "MAXSIM_CUDA_FORCE_MMA_SYNC" not in os.environ
