"""benchmarks/render_tables.py: the README tables rendered from a compare.py JSON.

Synthetic JSON shaped like compare.py's output (the per-implementation rate fields are filled
in by compare.py's own add_rates, so the two stay in step). Runs without a build or a GPU.
"""
from __future__ import annotations

import copy
import json

import pytest

from conftest import REPO_ROOT, _load_source_module

RT = _load_source_module("maxsim_render_tables", REPO_ROOT / "benchmarks" / "render_tables.py")
COMPARE = _load_source_module("maxsim_bench_compare", REPO_ROOT / "benchmarks" / "compare.py")

CAPTURE_ERR = "RuntimeError: CUDA error: operation not permitted when stream is capturing"


def impl(ms, graph_ms=None, graph_error=None, na=None):
    if na:
        return dict(na=na, **COMPARE.NO_GRAPH)
    return dict(max_err=0.0, ms=ms, min_ms=0.9 * ms, peak_bytes=1024, graph_ms=graph_ms,
                graph_min_ms=None if graph_ms is None else 0.9 * graph_ms,
                graph_error=graph_error, graph_max_err=None if graph_ms is None else 0.0)


def row(workload, surface, train, layout, dtype, impls, bytes_, flops, floor_ms):
    r = dict(workload=workload, surface=surface, train=train, layout=layout, dtype=dtype,
             shape=dict(B=32, C=10, Lq=32, Ld=180), scale=1.0, bytes=bytes_, flops=flops,
             floor_ms=floor_ms, impls=impls)
    for i in impls.values():
        COMPARE.add_rates(r, i)
    m = impls["maxsim"]
    r.update(maxsim_GBps=bytes_ / (m["ms"] * 1e-3) / 1e9, maxsim_TFLOPs=flops / (m["ms"] * 1e-3) / 1e12,
             of_floor=floor_ms / m["ms"], graph_of_floor=m["graph_of_floor"])
    return r


def cuda_json():
    results = [
        row("SmallRerank", "padded", False, "full", "float16", dict(
            maxsim=impl(0.098, 0.084), naive=impl(0.145, 0.120), LIK=impl(0.109, 0.101),
            FM=impl(5.65, None, CAPTURE_ERR)), 15_007_744, 4.7e8, 0.0042),
        row("RerankPacked", "packed", False, "ragged", "float16", dict(
            maxsim=impl(0.053, 0.031), naive=impl(0.715, 0.650),
            LIK=impl(None, na="TypeError: unexpected keyword max_seqlen_d"),
            FM=impl(0.059, 0.041)), 46_000_000, 9.0e8, 0.011),
        row("ColBERTCorpus", "contrastive", False, "ragged", "float16", dict(
            maxsim=impl(3.08, 2.95), naive=impl(24.8, 24.1), LIK=impl(4.30, 4.21),
            FM=impl(3.96, 3.80)), 700_000_000, 3.2e14, 0.431),
        row("BigColBERT", "contrastive", True, "full", "bfloat16", dict(
            maxsim=impl(5.20, 4.10), naive=impl(29.1, 28.0), LIK=impl(4.75, 4.60),
            FM=impl(5.64, None, CAPTURE_ERR)), 48_000_000, 3.87e14, 0.495),
    ]
    info = dict(device="cuda", torch="2.11.0+cu130", iters=50, warmup=10, threads=16,
                gpu="NVIDIA H200", device_name="NVIDIA H200", cuda="13.0",
                date="2026-11-20T10:00:00+00:00", git_commit="0123456789abcdef", git_dirty=False,
                graph=True, versions={"late-interaction-kernels": "0.4.5", "flash-maxsim": "0.3.0"})
    floors = dict(copy_bytes_per_s=4.23e12,
                  matmul_flops_per_s={"float16": 7.48e14, "bfloat16": 7.82e14})
    return dict(info=info, floors=floors, results=results, table="")


def cpu_json():
    data = cuda_json()
    data["info"].update(device="cpu", torch="2.13.0+cpu", gpu=None, device_name="AMD EPYC",
                        cuda=None, graph=False)
    for r in data["results"]:
        for name, i in r["impls"].items():
            if name in ("LIK", "FM"):
                r["impls"][name] = dict(na="RuntimeError: Triton kernels, CUDA only", **COMPARE.NO_GRAPH)
            else:
                i.update(COMPARE.NO_GRAPH)
            COMPARE.add_rates(r, r["impls"][name])
        r["graph_of_floor"] = None
    return data


def tables(md):
    """Every Markdown table in md as a list of {header: cell} rows."""
    out, cur = [], None
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if cur is None:
                cur = {"head": cells, "rows": []}
                out.append(cur)
            elif not set(line) <= set("|-"):
                assert len(cells) == len(cur["head"]), line
                cur["rows"].append(dict(zip(cur["head"], cells)))
        else:
            cur = None
    return out


def by_workload(table):
    return {r["workload"]: r for r in table["rows"]}


def test_cuda_tables_show_eager_and_gpu_only_per_implementation():
    md = RT.render(cuda_json())
    scoring, training = tables(md)
    for t in (scoring, training):
        assert t["head"] == ["workload", "layout", "dtype", "maxsim eager", "maxsim GPU-only",
                             "LIK eager", "LIK GPU-only", "FM eager", "FM GPU-only", "naive eager",
                             "floor", "maxsim GPU-only rate", "maxsim GPU-only of floor"]
    s = by_workload(scoring)
    assert list(s) == ["SmallRerank", "RerankPacked", "ColBERTCorpus"]
    assert list(by_workload(training)) == ["BigColBERT"]
    small = s["SmallRerank"]
    assert (small["maxsim eager"], small["maxsim GPU-only"]) == ("0.098", "0.084")
    assert (small["LIK eager"], small["LIK GPU-only"]) == ("0.109", "0.101")
    assert (small["FM eager"], small["FM GPU-only"]) == ("5.65", "n/a")     # capture failed
    assert small["naive eager"] == "0.145"
    assert s["RerankPacked"]["LIK eager"] == s["RerankPacked"]["LIK GPU-only"] == "n/a"
    # Rates from the GPU-only time: input TB/s on rerank rows, useful TFLOP/s elsewhere.
    assert small["maxsim GPU-only rate"] == f"{15_007_744 / 0.084e-3 / 1e12:.3g} TB/s"
    assert small["maxsim GPU-only of floor"] == f"{100 * 0.0042 / 0.084:.0f}%"
    assert s["ColBERTCorpus"]["maxsim GPU-only rate"] == f"{3.2e14 / 2.95e-3 / 1e12:.3g} TFLOP/s"
    big = by_workload(training)["BigColBERT"]
    assert big["FM GPU-only"] == "n/a" and big["maxsim GPU-only rate"].endswith("TFLOP/s")
    assert big["floor"] == "0.495"


def test_renderer_rates_agree_with_compare_json_fields():
    data = cuda_json()
    for r in data["results"]:
        m = r["impls"]["maxsim"]
        value = m["graph_TBps"] if r["surface"] in ("padded", "packed") else m["graph_TFLOPs"]
        assert RT.rate(r, m["graph_ms"]).split()[0] == f"{value:.3g}"
        assert RT.of_floor(r, m["graph_ms"]) == f"{100 * r['graph_of_floor']:.0f}%"
        assert m["eager_over_graph"] == pytest.approx(m["ms"] / m["graph_ms"])


def test_header_and_notes_come_from_the_metadata():
    md = RT.render(cuda_json())
    head = md.splitlines()[0]
    for part in ("NVIDIA H200", "torch 2.11.0+cu130", "CUDA 13.0", "2026-11-20", "commit 0123456",
                 "median of 50", "GPU-only", "late-interaction-kernels 0.4.5", "flash-maxsim 0.3.0"):
        assert part in head, part
    assert f"- FM GPU-only n/a: {CAPTURE_ERR} (SmallRerank full, BigColBERT full)" in md
    assert "- LIK n/a: TypeError: unexpected keyword max_seqlen_d (RerankPacked ragged)" in md
    assert "copy 4.23 TB/s" in md


def test_cpu_json_gets_eager_columns_and_names_the_peers_left_out():
    md = RT.render(cpu_json())
    assert "GPU-only" not in md and "CUDA" not in md.splitlines()[0]
    scoring, training = tables(md)
    assert scoring["head"] == ["workload", "layout", "dtype", "maxsim", "naive", "floor",
                               "maxsim eager rate", "maxsim eager of floor"]
    assert by_workload(scoring)["SmallRerank"]["maxsim eager rate"] == \
        f"{15_007_744 / 0.098e-3 / 1e12:.3g} TB/s"
    assert "- LIK: n/a on every row (RuntimeError: Triton kernels, CUDA only): left out" in md


def test_old_json_without_graph_fields_renders_eager_only():
    data = cuda_json()
    del data["info"]["graph"]
    for r in data["results"]:
        for i in r["impls"].values():
            for k in [k for k in i if k.startswith("graph_")]:
                del i[k]
    md = RT.render(data)
    assert "GPU-only" not in md
    assert by_workload(tables(md)[0])["SmallRerank"]["maxsim"] == "0.098"


README = """# title

text before
<!-- bench:cuda:begin -->
old table line
| old | table |
<!-- bench:cuda:end -->
text after, kept
"""


def test_readme_markers_are_replaced_and_the_rest_is_kept(tmp_path):
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(cuda_json()))
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert RT.main(["--json", str(src), "--readme", str(readme)]) == 0
    text = readme.read_text()
    before, rest = text.split("<!-- bench:cuda:begin -->\n")
    inside, after = rest.split("<!-- bench:cuda:end -->\n")
    assert before == "# title\n\ntext before\n" and after == "text after, kept\n"
    assert "old table" not in inside
    assert inside == "\n" + RT.render(cuda_json()) + "\n"
    assert RT.main(["--json", str(src), "--readme", str(readme)]) == 0
    assert readme.read_text() == text      # idempotent


def test_readme_without_markers_or_of_another_device_is_left_alone(tmp_path, capsys):
    cuda_src, cpu_src = tmp_path / "cuda.json", tmp_path / "cpu.json"
    cuda_src.write_text(json.dumps(cuda_json()))
    cpu_src.write_text(json.dumps(cpu_json()))
    plain = tmp_path / "plain.md"
    plain.write_text("# no markers\n")
    assert RT.main(["--json", str(cuda_src), "--readme", str(plain)]) == 1
    assert plain.read_text() == "# no markers\n"
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert RT.main(["--json", str(cpu_src), "--readme", str(readme)]) == 1   # cpu markers absent
    assert readme.read_text() == README
    broken = README.replace("<!-- bench:cuda:end -->\n", "") + "<!-- bench:cuda:begin -->\n"
    assert RT.replace_between_markers(broken, "cuda", "x") is None


def test_out_file_and_stdout(tmp_path, capsys):
    src = tmp_path / "bench.json"
    data = copy.deepcopy(cuda_json())
    src.write_text(json.dumps(data))
    assert RT.main(["--json", str(src)]) == 0
    assert capsys.readouterr().out == RT.render(data)
    out = tmp_path / "tables.md"
    assert RT.main(["--json", str(src), "--out", str(out)]) == 0
    assert out.read_text() == RT.render(data) and capsys.readouterr().out == ""
