#!/usr/bin/env python3
"""Markdown tables and a chart from one benchmarks/compare.py JSON.

    python3 benchmarks/render_tables.py --json out.json                  # to stdout
    python3 benchmarks/render_tables.py --json out.json --out tables.md
    python3 benchmarks/render_tables.py --json benchmarks/results/h100_cuda.json \
        --readme docs/benchmarks.md --readme README.md --chart docs/h100_floor_share.svg

The last is how the published tables, the README's summary and its chart are regenerated.

Two tables: scoring rows (padded and packed rerank, corpus scoring) and training rows
(forward + backward); a third, where the JSON has rows with compressed documents (int8 /
float8 e4m3fn, compare.py --documents), for those: per workload and layout the plain row
(the same documents in the query dtype) and each compressed row, with the stored bytes per
document token, maxsim's eager and GPU-only times, its time relative to the plain row, its
fraction of copy bandwidth (the bytes the call moves at the measured copy rate), the largest
score change quantisation made, and the peers' compressed entry points. Per workload, layout and dtype: maxsim eager and GPU-only, every
peer's eager and GPU-only, naive PyTorch (eager), the floor, maxsim's achieved rate at its
GPU-only time (input TB/s on rerank rows, useful TFLOP/s on the others, as compare.py
defines them) and its fraction of the floor. A header line states the device, torch, date
and commit from the JSON's metadata.

eager = CUDA events around one call issued from Python (launch overhead included);
GPU-only = the same call captured in a CUDA graph, median of the replays (per call, where
compare.py captured several calls to a graph: graph_calls). A JSON without
GPU-only times (a CPU run, --no-graph, or one written before compare.py measured them) gets
the eager columns only, and the rate and fraction of the floor from the eager time.
Implementations that ran on no row (on the CPU: the Triton-only peers) are left out and
named, with their reason, under the tables.

--readme FILE (repeatable) rewrites, in FILE, the lines between `<!-- bench:<device>:begin -->`
and `<!-- bench:<device>:end -->` with the tables, and those between
`<!-- bench:<device>:summary:begin -->` and `<!-- bench:<device>:summary:end -->` with the
summary (a few headline rows: maxsim, each peer and the best peer's time over maxsim's,
GPU-only, and how many rows maxsim leads); <device> is the JSON's (cuda or cpu), so a CPU
run cannot overwrite the GPU tables. A file with neither pair is left as is (exit status 1).

--chart FILE (.svg or .png) draws, for every plain row with GPU-only times, maxsim and each
peer as a share of the row's measured floor (floor / GPU-only time), scoring and training in
two panels. It needs matplotlib (a benchmark-only dependency: kernels[benchmark] brings it);
the rest reads JSON only: no torch needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

IMPLS = ("maxsim", "naive", "LIK", "FM")   # compare.py's order; others follow as found
PEER_NAMES = {"LIK": "late-interaction-kernels", "FM": "flash-maxsim"}
# The peers' compressed entry points (compare.py's COMPRESSED_IMPLS), as the table names them.
# decompress + maxsim is not a peer but the pipeline the fused call replaces: a column the same way.
COMPRESSED_PEERS = {"LIK-fp8": "LIK fp8", "FM-int8": "FM int8", "FM-int8-affine": "FM int8 affine",
                    "maxsim-decompress": "decompress + maxsim", "LIK-residual": "LIK residual",
                    "LIK-centroids": "LIK centroids"}
FORMAT_NAMES = {"int8": "int8", "float8_e4m3fn": "fp8 e4m3fn", "residual1": "residual 1-bit",
                "residual2": "residual 2-bit", "residual4": "residual 4-bit",
                "centroids": "centroid codes (approximate)"}
RESIDUAL_FORMATS = ("residual1", "residual2", "residual4", "centroids")


# ---- numbers -----------------------------------------------------------------------------

def fmt_ms(x):
    if x is None:
        return "n/a"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}" if x >= 0.01 else f"{x:.2g}"


def _sig(x):
    return f"{x:.3g}"


def rerank(row):
    # Rerank rows read each document for one query only: bandwidth-bound, so TB/s.
    return row["surface"] in ("padded", "packed")


def rate(row, ms):
    """Achieved rate of a time, as compare.py's add_rates computes it."""
    if not ms:
        return "n/a"
    if rerank(row):
        return f"{_sig(row['bytes'] / (ms * 1e-3) / 1e12)} TB/s"
    return f"{_sig(row['flops'] / (ms * 1e-3) / 1e12)} TFLOP/s"


def of_floor(row, ms):
    return f"{100 * row['floor_ms'] / ms:.0f}%" if ms else "n/a"


# ---- tables ------------------------------------------------------------------------------

def is_compressed(row):
    """A row whose documents are stored compressed (older JSON: no such rows)."""
    return row.get("documents", row["dtype"]) != row["dtype"]


def impl_order(results):
    seen = {n for row in results for n in row["impls"]}
    return [n for n in IMPLS if n in seen] + sorted(seen - set(IMPLS))


def has_graph(data):
    info = data.get("info", {})
    if "graph" in info:
        return bool(info["graph"])
    return any(r.get("graph_ms") is not None or r.get("graph_error")
               for row in data["results"] for r in row["impls"].values())


def table(rows, shown, graph):
    """One Markdown table; `shown` = implementations with columns, maxsim first, naive last."""
    peers = [n for n in shown if n not in ("maxsim", "naive")]
    basis = "GPU-only" if graph else "eager"
    head = ["workload", "layout", "dtype"]
    for n in ["maxsim"] + peers:
        head += [f"{n} eager", f"{n} GPU-only"] if graph else [n]
    if "naive" in shown:
        head.append("naive eager" if graph else "naive")
    head += ["floor", f"maxsim {basis} rate", f"maxsim {basis} of floor"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for row in rows:
        im = row["impls"]
        cells = [row["workload"], row["layout"], row["dtype"]]
        for n in ["maxsim"] + peers:
            r = im.get(n, {})
            cells.append(fmt_ms(r.get("ms")))
            if graph:
                cells.append(fmt_ms(r.get("graph_ms")))
        if "naive" in shown:
            cells.append(fmt_ms(im.get("naive", {}).get("ms")))
        m = im.get("maxsim", {})
        ms = m.get("graph_ms") if graph else m.get("ms")
        cells += [fmt_ms(row["floor_ms"]), rate(row, ms), of_floor(row, ms)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def header(data, graph, shown):
    info = data.get("info", {})
    device = info.get("device", "?")
    name = info.get("device_name") or info.get("gpu") or device
    parts = [name, f"torch {info.get('torch', '?')}"]
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    parts.append(info["date"][:10] if info.get("date") else "date not recorded")
    if info.get("git_commit"):
        dirty = " + local changes" if info.get("git_dirty") else ""
        parts.append(f"commit {info['git_commit'][:7]}{dirty}")
    line = ", ".join(parts) + "."
    clock = "CUDA events" if device == "cuda" else "time.perf_counter"
    line += (f" Times in ms, median of {info.get('iters', '?')} calls after "
             f"{info.get('warmup', '?')} warm-up ({clock}).")
    if graph:
        calls = [r.get("graph_calls") for row in data["results"] for r in row["impls"].values()]
        per_call = any(c and c > 1 for c in calls)
        line += (" eager = one call issued from Python (launch overhead included); GPU-only ="
                 " the same call captured in a CUDA graph, median of its replays"
                 + (", per call (small calls several to a graph, so that the graph's launch is"
                    " not counted)." if per_call else "."))
    versions = info.get("versions") or {}
    peers = [f"{k} = {v} {versions[v]}" if versions.get(v) else f"{k} = {v}"
             for k, v in PEER_NAMES.items() if k in shown]
    if peers:
        line += " " + ", ".join(peers) + "."
    return line


def notes(data, shown, dropped, results=None, shape_rows=None, extra=()):
    """Notes under the tables: n/a reasons of the plain rows, peers left out, `extra` (the
    compressed rows' notes), shapes of every row's workload, floors."""
    results = data["results"] if results is None else results
    out = []
    reasons = {}   # (label, reason) -> workloads
    for row in results:
        for n, r in row["impls"].items():
            if n in dropped:
                continue
            label, why = (n, r["na"]) if "na" in r else (f"{n} GPU-only", r.get("graph_error"))
            if n == "naive" and "na" not in r:
                continue   # the tables show naive's eager time only
            if why:
                reasons.setdefault((label, why), []).append(f"{row['workload']} {row['layout']}")
    for (label, why), where in reasons.items():
        out.append(f"- {label} n/a: {why} ({', '.join(dict.fromkeys(where))})")
    for n in dropped:
        why = sorted({row["impls"][n].get("na", "") for row in results if n in row["impls"]} - {""})
        out.append(f"- {n}: n/a on every row ({'; '.join(why) or 'no timings'}): left out")
    out += extra
    shapes = {row["workload"]: ", ".join(f"{k}={v}" for k, v in row["shape"].items())
              for row in (results if shape_rows is None else shape_rows)}
    out.append("- shapes: " + "; ".join(f"{k} ({v})" for k, v in shapes.items()))
    floors = data.get("floors")
    if floors:
        out.append("- floor = max(input bytes / copy bandwidth, useful FLOPs / matmul rate): copy "
                   f"{floors['copy_bytes_per_s'] / 1e12:.3g} TB/s; matmul "
                   + ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s"
                               for k, v in floors["matmul_flops_per_s"].items()))
    return out


def _ratio(x):
    return "n/a" if x is None else f"{x:.2f}x"


def copy_ms(row, data):
    """The row's bytes at the measured copy bandwidth (compare.py's copy_ms)."""
    if row.get("copy_ms") is not None:
        return row["copy_ms"]
    bw = (data.get("floors") or {}).get("copy_bytes_per_s")
    return 1e3 * row["bytes"] / bw if bw else None


def compressed_groups(results):
    """[(plain row or None, [compressed rows])] per (workload, layout, dtype), in run order."""
    groups = {}
    for row in results:
        if is_compressed(row):
            groups.setdefault((row["workload"], row["layout"], row["dtype"]), []).append(row)
    plain = {(r["workload"], r["layout"], r["dtype"]): r for r in results if not is_compressed(r)}
    return [(plain.get(key), rows) for key, rows in groups.items()]


def compressed_table(data, groups, peers, naive, graph):
    """The compressed-documents table: each group's plain row, then its compressed rows."""
    basis = "GPU-only" if graph else "eager"
    head = ["workload", "layout", "documents", "bytes / token"]
    head += ["maxsim eager", "maxsim GPU-only"] if graph else ["maxsim"]
    head += [f"maxsim {basis} vs plain", f"maxsim {basis} of copy bandwidth",
             "max score change vs plain"]
    for n in peers:
        head += [f"{COMPRESSED_PEERS[n]} eager", f"{COMPRESSED_PEERS[n]} GPU-only"] if graph \
            else [COMPRESSED_PEERS[n]]
    if naive:
        head.append("naive eager" if graph else "naive")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    key = "graph_ms" if graph else "ms"
    for plain, rows in groups:
        plain_ms = (plain or {}).get("impls", {}).get("maxsim", {}).get(key)
        for row in ([plain] if plain else []) + rows:
            m = row["impls"].get("maxsim", {})
            ms = m.get(key)
            comp = is_compressed(row)
            bpt = row.get("document_bytes_per_token")
            cells = [row["workload"], row["layout"],
                     FORMAT_NAMES.get(row.get("documents"), row.get("documents") or row["dtype"]),
                     str(bpt) if bpt else "n/a", fmt_ms(m.get("ms"))]
            if graph:
                cells.append(fmt_ms(m.get("graph_ms")))
            if not comp:
                vs_plain = "1.00x" if ms else "n/a"
            else:
                vs_plain = _ratio(ms / plain_ms if ms and plain_ms else
                                  row.get("maxsim_graph_over_plain" if graph else "maxsim_over_plain"))
            c = copy_ms(row, data)
            change = row.get("max_err_vs_plain")
            cells += [vs_plain, f"{100 * c / ms:.0f}%" if c and ms else "n/a",
                      "" if not comp else ("n/a" if change is None else f"{change:.2g}")]
            for n in peers:
                r = row["impls"].get(n)
                if r is None:   # not an entry point of this format
                    cells += ["–", "–"] if graph else ["–"]
                    continue
                cells.append(fmt_ms(r.get("ms")))
                if graph:
                    cells.append(fmt_ms(r.get("graph_ms")))
            if naive:
                cells.append(fmt_ms(row["impls"].get("naive", {}).get("ms")) if comp else "–")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compressed_notes(rows, peers):
    """Why a compressed-row implementation has no time, how the peers were called, and the
    peers left out (n/a on every row)."""
    out, reasons = [], {}
    for row in rows:
        for n, r in row["impls"].items():
            if n not in peers and n != "maxsim":
                continue
            label = COMPRESSED_PEERS.get(n, n)
            for what in (f"n/a: {r['na']}" if "na" in r else None,
                         f"GPU-only n/a: {r['graph_error']}" if r.get("graph_error") else None,
                         f"called as a {r['note']}" if r.get("note") else None):
                if what:
                    reasons.setdefault((label, what), []).append(f"{row['workload']} {row['layout']}")
    for (label, what), where in reasons.items():
        out.append(f"- {label} {what} ({', '.join(dict.fromkeys(where))})")
    for n in COMPRESSED_PEERS:
        if n in peers or not any(n in row["impls"] for row in rows):
            continue
        why = sorted({row["impls"][n].get("na", "") for row in rows if n in row["impls"]} - {""})
        out.append(f"- {COMPRESSED_PEERS[n]}: n/a on every row ({'; '.join(why) or 'no timings'}): left out")
    return out


COMPRESSED_TITLE = (
    "Compressed documents (maxsim: int8 or float8 e4m3fn values and one float32 scale per token; "
    "the plain row scores the same documents in the query dtype; bytes moved = values + scales + "
    "queries + float32 scores):")
RESIDUAL_TITLE = (
    "Residual documents (ColBERTv2 / PLAID codes; the plain row scores the same documents in the "
    "query dtype):")
COMPRESSED_LEGEND = (
    "- compressed rows: max score change = largest |compressed - plain| maxsim score on these "
    "random inputs")
RESIDUAL_LEGEND = (
    "- residual rows: ColBERTv2 / PLAID codes of the same documents (a 4-byte centroid id and nbits "
    "bits per dimension a token; bytes moved = codes + packed residuals + queries + scores + the "
    "centroids once); centroid codes = PLAID's centroid-only score of the 2-bit index's codes (an "
    "approximation: its score change vs plain is the approximation's); decompress + maxsim = the "
    "tokens decompressed by PyTorch ops into the query dtype, then maxsim's float call; LIK residual "
    "= late_interaction_kernels maxsim_residual (padded) / maxsim_residual_varlen (packed) on the "
    "same tokens, one query a call, the bytes re-packed in its bit order beforehand; LIK centroids "
    "= its plaid_approx_score, each query's centroid table (a float32 matmul) in the call")
COMPRESSED_PEER_LEGEND = (
    "; LIK fp8 = late_interaction_kernels maxsim_inference_fp8 with its own per-token quantiser "
    "on both sides (the queries are fp8 too); FM int8 / FM int8 affine = "
    "flash_maxsim_int8_symmetric (int8, fp16 scale) / flash_maxsim_int8 (uint8, fp16 scale and "
    "minimum) with their own quantisers, queries in fp16; – = no entry point for that format")


def render(data):
    """The Markdown: header line, scoring table, training table, compressed-documents table
    (where the JSON has compressed rows), notes."""
    all_results = data["results"]
    results = [r for r in all_results if not is_compressed(r)]
    compressed = [r for r in all_results if is_compressed(r)]
    graph = has_graph(data)
    order = impl_order(results)
    ran = [n for n in order if any("ms" in row["impls"].get(n, {}) for row in results)]
    shown = ["maxsim"] + [n for n in ran if n not in ("maxsim", "naive")] + \
        (["naive"] if "naive" in ran else [])
    dropped = [n for n in order if n not in shown]
    peers = [n for n in COMPRESSED_PEERS
             if any("ms" in row["impls"].get(n, {}) for row in compressed)]
    naive = any("ms" in row["impls"].get("naive", {}) for row in compressed)
    parts = [header(data, graph, shown + [n.split("-")[0] for n in peers])]
    for title, rows in (("Scoring (rerank, packed, corpus)", [r for r in results if not r["train"]]),
                        ("Training steps (forward + backward)", [r for r in results if r["train"]])):
        if rows:
            parts += [f"{title}:", table(rows, shown, graph)]
    extra = []
    if compressed:
        residual_only = all(r.get("documents") in RESIDUAL_FORMATS for r in compressed)
        parts += [RESIDUAL_TITLE if residual_only else COMPRESSED_TITLE,
                  compressed_table(data, compressed_groups(all_results), peers, naive, graph)]
        quantised_peers = any(n in ("LIK-fp8", "FM-int8", "FM-int8-affine") for n in peers)
        extra = compressed_notes(compressed, peers) + \
            [COMPRESSED_LEGEND + (COMPRESSED_PEER_LEGEND if quantised_peers else "")]
        if any(r.get("documents") in RESIDUAL_FORMATS for r in compressed):
            extra.append(RESIDUAL_LEGEND)
    parts.append("\n".join(notes(data, shown, dropped, results, all_results, extra)))
    return "\n\n".join(parts) + "\n"


# ---- summary and chart ---------------------------------------------------------------------

# The README's headline rows, (workload, layout): rows where a peer leads are among them.
HEADLINE = (("HeavyRerank", "full"), ("HeavyRerank", "ragged"), ("LongDocStress", "full"),
            ("SmallRerankPacked", "ragged"), ("HeavyRerankPacked", "ragged"),
            ("ColBERTCorpus", "ragged"), ("ColPaliCorpus", "ragged"), ("ContrastiveD1024", "full"),
            ("BigColBERT", "full"), ("DocDoc", "full"))


def plain_rows(data):
    return [r for r in data["results"] if not is_compressed(r)]


def peers_of(data):
    return [n for n in impl_order(plain_rows(data)) if n not in ("maxsim", "naive")]


def row_label(row):
    """One row's name in the chart and summary: the layout only on the padded surface, whose
    workloads run in both layouts."""
    if row["train"]:
        return f"{row['workload']} (train)"
    return f"{row['workload']} {row['layout']}" if row["surface"] == "padded" else row["workload"]


def summary(data):
    """Markdown: the HEADLINE rows with maxsim's and each peer's time (GPU-only where the
    JSON has it) and the best peer's time over maxsim's, then how many plain rows maxsim
    leads."""
    graph = has_graph(data)
    key = "graph_ms" if graph else "ms"
    peers = [n for n in peers_of(data)
             if any(r["impls"].get(n, {}).get(key) for r in plain_rows(data))]
    rows = {(r["workload"], r["layout"]): r for r in plain_rows(data)}
    head = ["workload", "maxsim ms"] + [f"{n} ms" for n in peers] + ["best peer / maxsim"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]

    def best_peer(row):
        times = [row["impls"].get(n, {}).get(key) for n in peers]
        times = [t for t in times if t]
        return min(times) if times else None

    for wl in HEADLINE:
        row = rows.get(wl)
        if row is None:
            continue
        m = row["impls"]["maxsim"].get(key)
        best = best_peer(row)
        cells = [row_label(row), fmt_ms(m)] + [fmt_ms(row["impls"].get(n, {}).get(key)) for n in peers]
        cells.append(_ratio(best / m) if best and m else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    compared = [(r["impls"]["maxsim"].get(key), best_peer(r)) for r in plain_rows(data)]
    compared = [(m, b) for m, b in compared if m and b]
    ahead = sum(m < b for m, b in compared)
    info = data.get("info", {})
    name = info.get("device_name") or info.get("gpu") or info.get("device", "?")
    when = info["date"][:10] if info.get("date") else "date not recorded"
    commit = f", commit {info['git_commit'][:7]}" if info.get("git_commit") else ""
    basis = "GPU-only (CUDA graph replay, per call)" if graph else "eager"
    names = ", ".join(f"{k} = {v}" for k, v in PEER_NAMES.items() if k in peers)
    top = f"{name}, {when}{commit}; times in ms, {basis}" + (f"; {names}" if names else "") + "."
    tail = (f"Ratio above 1: maxsim faster. Over every row of the run, maxsim is faster than the "
            f"best peer on {ahead} of the {len(compared)} where a peer ran.")
    if any("n/a" in line for line in lines[2:]):
        tail += " n/a: no time (the reasons are listed under the full tables)."
    return "\n\n".join([top, "\n".join(lines), tail]) + "\n"


def floor_shares(data):
    """[(panel, label, {implementation: share of the floor or None})] for the chart: every
    plain row, maxsim and the peers, share = floor_ms / GPU-only time."""
    if not has_graph(data):
        raise ValueError("the chart needs GPU-only times (a CUDA run of compare.py with graphs)")
    shown = ["maxsim"] + peers_of(data)
    out = []
    for row in plain_rows(data):
        shares = {}
        for n in shown:
            ms = row["impls"].get(n, {}).get("graph_ms")
            shares[n] = row["floor_ms"] / ms if ms else None
        out.append(("training" if row["train"] else "scoring", row_label(row), shares))
    return out


COLOURS = {"maxsim": "#1f5fbf", "LIK": "#e08a1e", "FM": "#3a9d5d"}


def chart(data, path):
    """Draw floor_shares(data) as grouped horizontal bars into path (.svg or .png); the
    output does not depend on the time it was drawn, so an unchanged JSON redraws the same
    file with the same matplotlib. Returns floor_shares(data)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = floor_shares(data)
    impls = list(shares[0][2]) if shares else ["maxsim"]
    panels = [p for p in ("scoring", "training") if any(s[0] == p for s in shares)]
    counts = [sum(s[0] == p for s in shares) for p in panels]
    rc = {"svg.fonttype": "none", "svg.hashsalt": "maxsim", "font.size": 9}
    with plt.rc_context(rc):
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, 0.26 * sum(counts) + 1.8),
                                 gridspec_kw={"height_ratios": counts}, squeeze=False)
        top = max([v for *_, sh in shares for v in sh.values() if v] + [1.0])
        width = 0.8 / len(impls)
        for ax, panel in zip(axes[:, 0], panels):
            rows = [s for s in shares if s[0] == panel]
            for k, n in enumerate(impls):
                ys = [i + (k - (len(impls) - 1) / 2) * width for i in range(len(rows))]
                vals = [100 * (r[2][n] or 0) for r in rows]
                ax.barh(ys, vals, height=width, color=COLOURS.get(n, f"C{k}"),
                        label=PEER_NAMES.get(n, n) if n != "maxsim" else "maxsim")
                for y, r in zip(ys, rows):
                    if r[2][n] is None:
                        ax.text(1, y, "n/a", va="center", fontsize=6, color=COLOURS.get(n, "grey"))
            ax.set_yticks(range(len(rows)), [r[1] for r in rows])
            ax.set_ylim(len(rows) - 0.5, -0.5)
            ax.axvline(100, color="black", linewidth=0.8)
            ax.set_xlim(0, 100 * top * 1.05)
            ax.set_title(f"{panel} ({'forward + backward' if panel == 'training' else 'forward'})",
                         loc="left", fontsize=9)
            ax.grid(axis="x", linewidth=0.3)
        axes[-1, 0].set_xlabel("% of the measured floor, GPU-only: higher is faster\n(the floor "
                               "counts padded bytes, so ragged rows can pass 100%)")
        axes[0, 0].legend(loc="lower right", fontsize=8)
        info = data.get("info", {})
        name = info.get("device_name") or info.get("gpu") or "GPU"
        commit = f", commit {info['git_commit'][:7]}" if info.get("git_commit") else ""
        fig.suptitle(f"{name}{commit}: each implementation's time against the hardware floor",
                     fontsize=10)
        fig.tight_layout(rect=(0, 0, 1, 0.98))
        fmt = Path(path).suffix.lstrip(".") or "svg"
        meta = {"Date": None} if fmt == "svg" else {"Software": None} if fmt == "png" else {}
        fig.savefig(path, format=fmt, metadata=meta, dpi=110)
        plt.close(fig)
    return shares


# ---- README ------------------------------------------------------------------------------

def replace_between_markers(text, tag, body):
    """text with the lines between the `bench:<tag>` markers replaced by body, or None."""
    begin, end = f"<!-- bench:{tag}:begin -->", f"<!-- bench:{tag}:end -->"
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        return None
    # Blank lines around the body: Markdown starts a table only after a blank line.
    return "".join(lines[:starts[0] + 1]) + "\n" + body.rstrip("\n") + "\n\n" + \
        "".join(lines[ends[0]:])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, help="a benchmarks/compare.py --json output")
    p.add_argument("--out", help="write the Markdown here (default: stdout, unless --readme "
                   "or --chart)")
    p.add_argument("--readme", action="append", default=[],
                   help="rewrite the bench:<device> and bench:<device>:summary marker sections "
                   "of this file (repeatable)")
    p.add_argument("--chart", help="draw the floor-share chart into this .svg or .png")
    args = p.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    md = render(data)
    status = 0
    if args.out:
        Path(args.out).write_text(md)
    elif not args.readme and not args.chart:
        sys.stdout.write(md)
    tag = data.get("info", {}).get("device", "cuda")
    for name in args.readme:
        readme = Path(name)
        text = new = readme.read_text()
        done = []
        for section, body in ((tag, md), (f"{tag}:summary", summary(data))):
            replaced = replace_between_markers(new, section, body)
            if replaced is not None:
                new = replaced
                done.append(f"bench:{section}")
        if not done:
            print(f"{readme}: no single <!-- bench:{tag}:begin --> ... <!-- bench:{tag}:end --> "
                  f"or bench:{tag}:summary pair; left unchanged", file=sys.stderr)
            status = 1
            continue
        if new != text:
            readme.write_text(new)
        print(f"updated the {' and '.join(done)} section of {readme}", file=sys.stderr)
    if args.chart:
        try:
            chart(data, args.chart)
        except ValueError as e:
            print(f"{args.chart}: {e}; not drawn", file=sys.stderr)
            return 1
        print(f"drew {args.chart}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
