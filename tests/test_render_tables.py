"""benchmarks/render_tables.py: the benchmark tables rendered from a compare.py JSON.

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


# ---- compressed documents ------------------------------------------------------------------

LOOP_NOTE = "per-query loop (32 calls)"


def compressed_row(workload, surface, layout, fmt, impls, bytes_, plain_ms, plain_graph_ms,
                   change, copy_bw=4.23e12, shape=None):
    r = dict(workload=workload, surface=surface, train=False, layout=layout, dtype="float16",
             documents=fmt, shape=shape or dict(B=32, C=100, Lq=32, Ld=256), scale=1.0,
             bytes=bytes_, flops=6.7e10, document_bytes_per_token=132,
             copy_ms=1e3 * bytes_ / copy_bw, floor_ms=1e3 * bytes_ / copy_bw, impls=impls)
    for i in impls.values():
        COMPARE.add_rates(r, i)
    m = impls["maxsim"]
    r.update(of_floor=r["floor_ms"] / m["ms"], graph_of_floor=m["graph_of_floor"])
    COMPARE.compare_with_plain(r, None, dict(ms=plain_ms, graph_ms=plain_graph_ms), None)
    r["max_err_vs_plain"] = change
    return r


def compressed_json():
    data = cuda_json()
    heavy = row("HeavyRerank", "padded", False, "full", "float16", dict(
        maxsim=impl(0.128, 0.078), naive=impl(0.228, 0.146), LIK=impl(0.183, 0.074),
        FM=impl(0.150, 0.075)), 210_000_000, 6.7e10, 0.050)
    heavy.update(documents="float16", document_bytes_per_token=256,
                 copy_ms=1e3 * 210_000_000 / 4.23e12)
    int8 = compressed_row("HeavyRerank", "padded", "full", "int8", dict(
        maxsim=impl(0.090, 0.045), naive=impl(0.400, 0.300),
        **{"FM-int8": dict(impl(1.20, 0.210), note=LOOP_NOTE),
           "FM-int8-affine": dict(impl(1.30, None, CAPTURE_ERR), note=LOOP_NOTE)}),
        108_000_000, 0.128, 0.078, 0.011)
    fp8 = compressed_row("HeavyRerank", "padded", "full", "float8_e4m3fn", dict(
        maxsim=impl(0.095, 0.047), naive=impl(0.420, 0.310),
        **{"LIK-fp8": dict(impl(0.900, 0.160), note=LOOP_NOTE)}), 108_000_000, 0.128, 0.078, 0.036)
    packed = compressed_row("HeavyRerankPacked", "packed", "ragged", "int8", dict(
        maxsim=impl(0.050, 0.031), naive=impl(1.5, 1.2),
        **{"FM-int8": impl(None, na="NoEntryPoint: no packed int8 entry point"),
           "FM-int8-affine": impl(None, na="NoEntryPoint: no packed int8 entry point")}),
        60_000_000, None, None, 0.009)
    data["results"][1:1] = [heavy, int8, fp8, packed]
    return data


def compressed_table_of(md):
    ts = tables(md)
    return next(t for t in ts if "documents" in t["head"])


def test_compressed_rows_get_their_own_table_and_stay_out_of_the_others():
    md = RT.render(compressed_json())
    scoring, training, comp = tables(md)
    assert "HeavyRerank" in by_workload(scoring)           # the plain row: main table too
    assert all(r["dtype"] == "float16" for r in scoring["rows"])
    assert "HeavyRerankPacked" not in by_workload(scoring)  # compressed only
    assert comp["head"] == [
        "workload", "layout", "documents", "bytes / token", "maxsim eager", "maxsim GPU-only",
        "maxsim GPU-only vs plain", "maxsim GPU-only of copy bandwidth", "max score change vs plain",
        "LIK fp8 eager", "LIK fp8 GPU-only", "FM int8 eager", "FM int8 GPU-only",
        "FM int8 affine eager", "FM int8 affine GPU-only", "naive eager"]
    rows = [(r["workload"], r["documents"]) for r in comp["rows"]]
    assert rows == [("HeavyRerank", "float16"), ("HeavyRerank", "int8"),
                    ("HeavyRerank", "fp8 e4m3fn"), ("HeavyRerankPacked", "int8")]
    plain, int8, fp8, packed = comp["rows"]
    assert (plain["bytes / token"], int8["bytes / token"]) == ("256", "132")
    assert plain["maxsim GPU-only vs plain"] == "1.00x"
    assert int8["maxsim GPU-only vs plain"] == f"{0.045 / 0.078:.2f}x"
    assert packed["maxsim GPU-only vs plain"] == "n/a"      # no plain row ran
    # Fraction of copy bandwidth: the row's bytes at the copy rate over maxsim's GPU-only time.
    assert int8["maxsim GPU-only of copy bandwidth"] == f"{100 * 108_000_000 / 4.23e12 / 0.045e-3:.0f}%"
    assert (int8["FM int8 eager"], int8["FM int8 GPU-only"]) == ("1.20", "0.210")
    assert (int8["FM int8 affine GPU-only"], packed["FM int8 eager"]) == ("n/a", "n/a")
    assert int8["LIK fp8 eager"] == int8["LIK fp8 GPU-only"] == "–"   # not an int8 entry point
    assert fp8["LIK fp8 GPU-only"] == "0.160" and fp8["FM int8 eager"] == "–"
    assert (int8["max score change vs plain"], plain["max score change vs plain"]) == ("0.011", "")
    assert (int8["naive eager"], plain["naive eager"]) == ("0.400", "–")


def test_compressed_notes_say_how_the_peers_were_called_and_why_not():
    md = RT.render(compressed_json())
    assert f"- FM int8 called as a {LOOP_NOTE} (HeavyRerank full)" in md
    assert f"- LIK fp8 called as a {LOOP_NOTE} (HeavyRerank full)" in md
    assert f"- FM int8 affine GPU-only n/a: {CAPTURE_ERR} (HeavyRerank full)" in md
    assert "- FM int8 n/a: NoEntryPoint: no packed int8 entry point (HeavyRerankPacked ragged)" in md
    assert "HeavyRerankPacked (B=32, C=100, Lq=32, Ld=256)" in md      # shapes of every row
    # The plain tables' notes do not list the compressed implementations as their own.
    assert "- FM-int8" not in md and "LIK-fp8" not in md


def test_compressed_ratio_and_copy_fraction_agree_with_compare_json_fields():
    data = compressed_json()
    for r in data["results"]:
        if not RT.is_compressed(r):
            continue
        m = r["impls"]["maxsim"]
        assert m["graph_of_copy"] == pytest.approx(r["copy_ms"] / m["graph_ms"])
        assert RT.copy_ms(r, data) == r["copy_ms"]
        if r["plain_graph_ms"]:
            assert r["maxsim_graph_over_plain"] == pytest.approx(m["graph_ms"] / r["plain_graph_ms"])
    # A row without copy_ms (older JSON) gets it from the floors' copy bandwidth.
    assert RT.copy_ms(dict(bytes=4.23e9), data) == pytest.approx(1.0)   # 4.23 GB at 4.23 TB/s


def test_cpu_compressed_table_has_eager_columns_and_leaves_the_peers_out():
    data = compressed_json()
    data["info"].update(device="cpu", graph=False, cuda=None)
    for r in data["results"]:
        for name in list(r["impls"]):
            if name not in ("maxsim", "naive"):
                r["impls"][name] = dict(na="RuntimeError: Triton kernels, CUDA only", **COMPARE.NO_GRAPH)
            else:
                r["impls"][name].update(COMPARE.NO_GRAPH)
            COMPARE.add_rates(r, r["impls"][name])
    md = RT.render(data)
    comp = compressed_table_of(md)
    assert comp["head"] == ["workload", "layout", "documents", "bytes / token", "maxsim",
                            "maxsim eager vs plain", "maxsim eager of copy bandwidth",
                            "max score change vs plain", "naive"]
    assert by_workload(comp)["HeavyRerankPacked"]["maxsim"] == "0.050"
    assert "- FM int8: n/a on every row (RuntimeError: Triton kernels, CUDA only): left out" in md


def test_json_without_compressed_rows_renders_as_before():
    md = RT.render(cuda_json())
    assert len(tables(md)) == 2 and "Compressed documents" not in md


def test_compare_plans_compressed_rows_after_their_plain_row():
    import argparse
    args = argparse.Namespace(device="cuda", workloads="all", dtype="auto", layout="table",
                              documents="auto")
    plan = [(w.name, dt, lay, fmt) for w, dt, lay, fmt in COMPARE.rows_to_run(args)]
    assert plan[plan.index(("HeavyRerank", "float16", "full", None)) + 1:][:2] == [
        ("HeavyRerank", "float16", "full", "int8"), ("HeavyRerank", "float16", "full", "float8_e4m3fn")]
    assert ("SingleQueryRerankPacked", "float16", "ragged", "int8") in plan
    assert ("ColPaliCorpus", "float16", "ragged", "float8_e4m3fn") in plan
    assert not any(fmt for name, _, _, fmt in plan if name in ("Rerank", "BigColBERT", "RerankD256"))
    args.workloads = "Rerank,HeavyRerankPacked,BigBatch"        # auto: the compressed set only
    assert [(w.name, fmt) for w, _, _, fmt in COMPARE.rows_to_run(args)] == [
        ("Rerank", None), ("Rerank", None), ("HeavyRerankPacked", None),
        ("HeavyRerankPacked", "int8"), ("HeavyRerankPacked", "float8_e4m3fn"), ("BigBatch", None)]
    args.device = "cpu"
    args.workloads = "default"
    assert all(fmt is None for *_, fmt in COMPARE.rows_to_run(args))   # CPU default: plain only
    args.workloads, args.documents = "SmallRerank", "int8"
    assert [fmt for *_, fmt in COMPARE.rows_to_run(args)] == ["int8"] * 4   # fp32, bf16 x 2 layouts
    assert COMPARE.compressed_impls("int8", ["maxsim", "FM"]) == ["maxsim", "FM-int8", "FM-int8-affine"]
    assert COMPARE.compressed_impls("float8_e4m3fn", COMPARE.IMPLS) == ["maxsim", "naive", "LIK-fp8"]


# ---- summary and chart ---------------------------------------------------------------------

def test_summary_lists_the_headline_rows_with_the_best_peer_over_maxsim():
    md = RT.summary(cuda_json())
    (t,) = tables(md)
    assert t["head"] == ["workload", "maxsim ms", "LIK ms", "FM ms", "best peer / maxsim"]
    rows = {r["workload"]: r for r in t["rows"]}
    assert list(rows) == ["ColBERTCorpus", "BigColBERT (train)"]   # the HEADLINE rows present
    assert rows["ColBERTCorpus"]["best peer / maxsim"] == f"{3.80 / 2.95:.2f}x"   # FM the best
    assert rows["BigColBERT (train)"]["FM ms"] == "n/a"                           # capture failed
    assert rows["BigColBERT (train)"]["best peer / maxsim"] == f"{4.60 / 4.10:.2f}x"
    assert "NVIDIA H200, 2026-11-20, commit 0123456" in md and "GPU-only" in md
    assert "faster than the best peer on 4 of the 4 where a peer ran" in md


def test_readme_summary_markers_are_rewritten_beside_the_table_markers(tmp_path):
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(cuda_json()))
    summary_only = tmp_path / "README.md"
    summary_only.write_text("intro\n<!-- bench:cuda:summary:begin -->\nold\n"
                            "<!-- bench:cuda:summary:end -->\nafter\n")
    both = tmp_path / "benchmarks.md"
    both.write_text(README + "<!-- bench:cuda:summary:begin -->\n<!-- bench:cuda:summary:end -->\n")
    assert RT.main(["--json", str(src), "--readme", str(summary_only), "--readme", str(both)]) == 0
    text = summary_only.read_text()
    assert text.startswith("intro\n") and text.endswith("after\n") and "old" not in text
    assert RT.summary(cuda_json()).strip() in text and "| SmallRerank |" not in text
    text = both.read_text()
    assert RT.render(cuda_json()).strip() in text and RT.summary(cuda_json()).strip() in text


def test_floor_shares_are_floor_over_gpu_only_time_and_need_graph_times():
    shares = {label: (panel, s) for panel, label, s in RT.floor_shares(cuda_json())}
    assert list(shares) == ["SmallRerank full", "RerankPacked", "ColBERTCorpus", "BigColBERT (train)"]
    panel, small = shares["SmallRerank full"]
    assert panel == "scoring" and list(small) == ["maxsim", "LIK", "FM"]     # naive is not drawn
    assert small["maxsim"] == pytest.approx(0.0042 / 0.084)
    assert small["LIK"] == pytest.approx(0.0042 / 0.101) and small["FM"] is None
    assert shares["RerankPacked"][1]["LIK"] is None                         # n/a eager too
    assert shares["BigColBERT (train)"][0] == "training"
    with pytest.raises(ValueError, match="GPU-only"):
        RT.floor_shares(cpu_json())


def test_chart_is_drawn_from_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    src = tmp_path / "bench.json"
    src.write_text(json.dumps(cuda_json()))
    svg = tmp_path / "chart.svg"
    assert RT.main(["--json", str(src), "--chart", str(svg)]) == 0
    text = svg.read_text()
    assert text.startswith("<?xml") and "</svg>" in text
    for label in ("SmallRerank full", "RerankPacked", "ColBERTCorpus", "BigColBERT (train)",
                  "maxsim", "late-interaction-kernels", "flash-maxsim", "NVIDIA H200"):
        assert label in text, label
    first = svg.read_bytes()
    assert RT.main(["--json", str(src), "--chart", str(svg)]) == 0
    assert svg.read_bytes() == first                    # no date or random ids in the file
    png = tmp_path / "chart.png"
    RT.chart(cuda_json(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cpu_src = tmp_path / "cpu.json"
    cpu_src.write_text(json.dumps(cpu_json()))
    assert RT.main(["--json", str(cpu_src), "--chart", str(tmp_path / "cpu.svg")]) == 1
    assert not (tmp_path / "cpu.svg").exists()


def test_the_published_chart_draws_every_row_of_the_h100_results(tmp_path):
    pytest.importorskip("matplotlib")
    data = json.loads((REPO_ROOT / "benchmarks" / "results" / "h100_cuda.json").read_text())
    out = tmp_path / "h100.svg"
    shares = RT.chart(data, out)
    text = out.read_text()
    assert len(shares) == len(RT.plain_rows(data))
    for _, label, s in shares:
        assert label in text, label
        assert s["maxsim"] is not None and 0 < s["maxsim"] < 2
    readme = (REPO_ROOT / "README.md").read_text()
    assert "docs/h100_floor_share.svg" in readme
    assert (REPO_ROOT / "docs" / "h100_floor_share.svg").is_file()


def test_residual_rows_render_with_their_own_title_columns_and_legend():
    plain = row("SingleQueryRerank", "padded", False, "full", "float16", dict(
        maxsim=impl(0.043, 0.030), naive=impl(0.104, 0.061), LIK=impl(0.100, 0.030),
        FM=impl(0.124, 0.033)), 77_000_000, 1.9e10, 0.026)
    res = row("SingleQueryRerank", "padded", False, "full", "float16", dict(
        maxsim=impl(0.082, 0.061), naive=impl(2.33, 2.28), **{
            "maxsim-decompress": impl(2.34, 2.25), "LIK-residual": impl(0.536, 0.415)}),
        11_000_000, 1.9e10, 0.026)
    cen = row("SingleQueryRerank", "padded", False, "full", "float16", dict(
        maxsim=impl(0.061, 0.0099), naive=impl(0.31, 0.17), **{"LIK-centroids": impl(0.075, 0.014)}),
        2_300_000, 1.9e10, 0.026)
    res.update(documents="residual2", document_bytes_per_token=36, max_err_vs_plain=0.66)
    cen.update(documents="centroids", document_bytes_per_token=4, max_err_vs_plain=0.89)
    data = cuda_json()
    data["results"] = [plain, res, cen]
    md = RT.render(data)
    assert RT.RESIDUAL_TITLE in md and RT.COMPRESSED_TITLE not in md
    assert RT.RESIDUAL_LEGEND in md and "LIK fp8 =" not in md
    comp = tables(md)[-1]
    assert ["decompress + maxsim GPU-only", "LIK residual GPU-only", "LIK centroids GPU-only"] == \
        [h for h in comp["head"] if h in ("decompress + maxsim GPU-only", "LIK residual GPU-only",
                                          "LIK centroids GPU-only")]
    docs = {r["documents"]: r for r in comp["rows"]}
    assert docs["residual 2-bit"]["LIK residual GPU-only"] == "0.415"
    assert docs["residual 2-bit"]["maxsim GPU-only vs plain"] == "2.03x"
    assert docs["centroid codes (approximate)"]["LIK centroids GPU-only"] == "0.014"
    assert docs["centroid codes (approximate)"]["LIK residual GPU-only"] == "–"
