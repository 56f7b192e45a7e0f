#!/usr/bin/env python3
"""Markdown tables from one benchmarks/compare.py JSON (the README's benchmark tables).

    python3 benchmarks/render_tables.py --json out.json                  # to stdout
    python3 benchmarks/render_tables.py --json out.json --out tables.md
    python3 benchmarks/render_tables.py --json out.json --readme README.md

Two tables: scoring rows (padded and packed rerank, corpus scoring) and training rows
(forward + backward). Per workload, layout and dtype: maxsim eager and GPU-only, every
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

--readme rewrites the lines between `<!-- bench:<device>:begin -->` and
`<!-- bench:<device>:end -->`, <device> being the JSON's (cuda or cpu), so a CPU run cannot
overwrite the GPU tables. Without those markers the README is left as is (exit status 1).

Reads JSON only: no torch needed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

IMPLS = ("maxsim", "naive", "LIK", "FM")   # compare.py's order; others follow as found
PEER_NAMES = {"LIK": "late-interaction-kernels", "FM": "flash-maxsim"}


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


def notes(data, shown, dropped):
    results = data["results"]
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
    shapes = {row["workload"]: ", ".join(f"{k}={v}" for k, v in row["shape"].items())
              for row in results}
    out.append("- shapes: " + "; ".join(f"{k} ({v})" for k, v in shapes.items()))
    floors = data.get("floors")
    if floors:
        out.append("- floor = max(input bytes / copy bandwidth, useful FLOPs / matmul rate): copy "
                   f"{floors['copy_bytes_per_s'] / 1e12:.3g} TB/s; matmul "
                   + ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s"
                               for k, v in floors["matmul_flops_per_s"].items()))
    return out


def render(data):
    """The Markdown: header line, scoring table, training table, notes."""
    results = data["results"]
    graph = has_graph(data)
    order = impl_order(results)
    ran = [n for n in order if any("ms" in row["impls"].get(n, {}) for row in results)]
    shown = ["maxsim"] + [n for n in ran if n not in ("maxsim", "naive")] + \
        (["naive"] if "naive" in ran else [])
    dropped = [n for n in order if n not in shown]
    parts = [header(data, graph, shown)]
    for title, rows in (("Scoring (rerank, packed, corpus)", [r for r in results if not r["train"]]),
                        ("Training steps (forward + backward)", [r for r in results if r["train"]])):
        if rows:
            parts += [f"{title}:", table(rows, shown, graph)]
    parts.append("\n".join(notes(data, shown, dropped)))
    return "\n\n".join(parts) + "\n"


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
    p.add_argument("--out", help="write the Markdown here (default: stdout, unless --readme)")
    p.add_argument("--readme", help="replace the bench:<device> marker section of this file")
    args = p.parse_args(argv)
    data = json.loads(Path(args.json).read_text())
    md = render(data)
    if args.out:
        Path(args.out).write_text(md)
    elif not args.readme:
        sys.stdout.write(md)
    if args.readme:
        tag = data.get("info", {}).get("device", "cuda")
        readme = Path(args.readme)
        new = replace_between_markers(readme.read_text(), tag, md)
        if new is None:
            print(f"{readme}: no single <!-- bench:{tag}:begin --> ... <!-- bench:{tag}:end --> "
                  "pair; left unchanged", file=sys.stderr)
            return 1
        readme.write_text(new)
        print(f"updated the bench:{tag} section of {readme}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
