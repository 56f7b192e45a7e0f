"""build.toml is the one list of what a release compiles (kernel-builder generates its CMake
from it; tools/build.py stages exactly those files). These tests run without a build."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from conftest import BUILD_TOOL, REPO_ROOT


def test_every_source_is_listed_and_every_listed_file_exists():
    problems = BUILD_TOOL.manifest_problems(BUILD_TOOL.load_config())
    assert not problems, "build.toml is out of date:\n" + "\n".join(problems)


def test_the_check_sees_an_unlisted_header_and_a_listed_file_that_is_gone(tmp_path):
    (tmp_path / "maxsim_x" / "kernel").mkdir(parents=True)
    (tmp_path / "torch-ext" / "maxsim").mkdir(parents=True)
    for f in ("maxsim_x/ops.cpp", "maxsim_x/kernel/tile.cuh", "torch-ext/torch_binding.cpp",
              "torch-ext/maxsim/__init__.py"):
        (tmp_path / f).write_text("// x\n")
    config = {"torch": {"src": ["torch-ext/torch_binding.cpp"]},
              "kernel": {"x": {"backend": "cuda", "src": ["maxsim_x/ops.cpp", "maxsim_x/gone.h"]}}}
    problems = BUILD_TOOL.manifest_problems(config, tmp_path)
    assert problems == ["maxsim_x/kernel/tile.cuh: on disk but not listed in build.toml",
                        "maxsim_x/gone.h: listed in build.toml but does not exist"]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_staging_copies_exactly_the_listed_files(backend, tmp_path):
    config = BUILD_TOOL.load_config()
    files, units = BUILD_TOOL.units_of(config, backend)
    BUILD_TOOL.stage(files, tmp_path / "src")
    staged = {p.relative_to(tmp_path / "src").as_posix()
              for p in (tmp_path / "src").rglob("*") if p.is_file()}
    assert staged == set(files)
    assert {u.src for u in units} == {f for f in files if f.endswith((".cpp", ".cu", ".mm"))}
    assert set(config["torch"]["src"]) <= staged


def test_stage_refuses_a_listed_file_that_is_gone(tmp_path):
    with pytest.raises(SystemExit, match="maxsim_cuda/kernel/mainloop.cuh"):
        BUILD_TOOL.stage(["maxsim_cpu/ops.cpp", "maxsim_cuda/kernel/mainloop.cuh"], tmp_path)


def test_every_backend_has_a_kernel_table_and_flags_follow_kernel_builder():
    config = tomllib.loads((REPO_ROOT / "build.toml").read_text())
    for backend in config["general"]["backends"]:
        assert BUILD_TOOL.kernel_tables(config, backend), f"no [kernel.*] table for {backend}"
    nvcc_flags = BUILD_TOOL.torch_nvcc_flags()
    assert not [f for f in nvcc_flags if f.startswith("-D__CUDA_NO_")]
    assert "--expt-relaxed-constexpr" in nvcc_flags


def test_the_spill_check_reads_ptxas_reports():
    """`build.py --compile-only --no-spills` (CI's CUDA compile) fails on what this finds: a
    report in ptxas -v's format, one kernel per target, only the spilling one named."""
    report = "\n".join([
        "ptxas info    : Compiling entry function '_Z6kernelILi3EEvv' for 'sm_90a'",
        "ptxas info    : Function properties for _Z6kernelILi3EEvv",
        "    8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads",
        "ptxas info    : Used 128 registers, used 16 barriers, 8 bytes cumulative stack size",
        "ptxas info    : Compiling entry function '_Z6kernelILi3EEvv' for 'sm_80'",
        "ptxas info    : Function properties for _Z6kernelILi3EEvv",
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 96 registers",
    ])
    assert BUILD_TOOL.spills_of(report) == [
        "sm_90a _Z6kernelILi3EEvv: 4 bytes spill stores, 8 bytes spill loads"]
    assert BUILD_TOOL.spills_of(report.replace("4 bytes spill stores, 8", "0 bytes spill stores, 0")) == []


def test_the_spill_check_holds_to_the_known_list(tmp_path):
    """A spill the list does not name fails, and so does a listed spill of a compiled target
    that is gone; listed spills of targets not compiled are left alone."""
    known = tmp_path / "known_spills.txt"
    a80 = "maxsim_cuda/a.cu: sm_80 _Z1av: 8 bytes spill stores, 8 bytes spill loads"
    b90 = "maxsim_cuda/b.cu: sm_90a _Z1bv: 4 bytes spill stores, 4 bytes spill loads"
    c89 = "maxsim_cuda/c.cu: sm_89 _Z1cv: 4 bytes spill stores, 4 bytes spill loads"
    known.write_text("\n".join(["# comment", a80, b90, c89]) + "\n")
    assert BUILD_TOOL.spill_problems([a80, b90], ["8.0", "9.0a"], known) == []
    new = "maxsim_cuda/d.cu: sm_80 _Z1dv: 4 bytes spill stores, 4 bytes spill loads"
    assert BUILD_TOOL.spill_problems([a80, b90, new], ["8.0", "9.0a"], known) == [
        f"spills (not in known_spills.txt): {new}"]
    assert BUILD_TOOL.spill_problems([a80], ["8.0", "9.0a"], known) == [
        f"no longer spills (remove it from known_spills.txt): {b90}"]
    grown = a80.replace("8 bytes spill stores", "12 bytes spill stores")
    assert len(BUILD_TOOL.spill_problems([grown, b90], ["8.0", "9.0a"], known)) == 2


def test_gencode_targets():
    """'X.Y' is SASS, '+PTX' adds the PTX the driver can JIT, and 'X.Y@A.B' compiles the
    compute_XY code into sm_AB SASS (the Ampere path on a Hopper card, no JIT at load)."""
    assert BUILD_TOOL.gencode_flags(["8.0", "9.0a"]) == [
        "-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a"]
    assert BUILD_TOOL.gencode_flags(["8.0+PTX"]) == ["-gencode=arch=compute_80,code=[sm_80,compute_80]"]
    assert BUILD_TOOL.gencode_flags(["8.0@9.0"]) == ["-gencode=arch=compute_80,code=sm_90"]
    # ptxas names such a kernel's target sm_90: the spill list is read for that target
    spill = "maxsim_cuda/a.cu: sm_90 _Z1av: 4 bytes spill stores, 4 bytes spill loads"
    assert BUILD_TOOL.spill_problems([spill], ["8.0@9.0"], Path("/nonexistent")) == [
        f"spills (not in nonexistent): {spill}"]
