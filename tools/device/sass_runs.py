"""Where a profiled kernel's stall samples sit, from the per-SASS-instruction counters that
`cli.py profile --ncu` leaves in $OUT/<tag>.sass.csv.gz (ncu's source page as CSV).

  python3 tools/device/sass_runs.py TAG.sass.csv.gz [--top 12] [--min-run 8]

Prints the stall reasons' shares over the whole kernel, then the executed code as runs of
consecutive instructions that executed equally often (start and end instruction index, how
many times, samples, "no instruction" samples, the commonest opcodes), then the instructions
with the most samples. The runs show the executed footprint against the kernel's size and
where the code jumps: the reading behind the 2026-11-27 instruction-fetch finding in
maxsim_cuda/NOTES.md. Runs here, without ncu.
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
from dataclasses import dataclass, field


@dataclass
class Run:
    start: int
    end: int
    executed: int
    samples: int = 0
    no_inst: int = 0
    ops: collections.Counter = field(default_factory=collections.Counter)


def opcode(source: str) -> str:
    words = source.split()
    if words and words[0].startswith("@"):  # predicated
        words = words[1:]
    return words[0] if words else ""


def read(path: str):
    """(header, rows) of the CSV: ncu writes the kernel's name on the first line."""
    with gzip.open(path, "rt") as f:
        lines = list(csv.reader(f))
    start = next(i for i, row in enumerate(lines) if row and row[0] == "Address")
    return lines[start], lines[start + 1:]


def summarise(header, rows, min_run=8, top=12):
    col = {h: i for i, h in enumerate(header)}
    stalls = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]

    def num(row, name):
        value = row[col[name]] if name in col else ""
        return int(float(value)) if value not in ("", "-") else 0

    base = int(rows[0][col["Address"]], 16)
    totals, samples, runs = collections.Counter(), 0, []
    for row in rows:
        index = (int(row[col["Address"]], 16) - base) // 16
        s, executed = num(row, "# Samples"), num(row, "Instructions Executed")
        samples += s
        for h in stalls:
            totals[h] += num(row, h)
        if executed == 0:
            continue
        if runs and runs[-1].end == index - 1 and runs[-1].executed == executed:
            run = runs[-1]
            run.end = index
        else:
            run = Run(index, index, executed)
            runs.append(run)
        run.samples += s
        run.no_inst += num(row, "stall_no_inst")
        run.ops[opcode(row[col["Source"]])] += 1
    shown = [r for r in runs if r.end - r.start + 1 >= min_run or r.samples >= max(1, samples // 100)]
    busiest = [((int(row[col["Address"]], 16) - base) // 16, num(row, "# Samples"), row[col["Source"]].strip())
               for row in sorted(rows, key=lambda row: -num(row, "# Samples"))[:top]]
    return {"instructions": len(rows), "executed": sum(r.end - r.start + 1 for r in runs), "samples": samples,
            "stalls": totals, "runs": runs, "shown": shown, "busiest": busiest}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv_gz")
    ap.add_argument("--top", type=int, default=12, help="instructions with the most samples")
    ap.add_argument("--min-run", type=int, default=8, help="shortest run listed (busier ones always are)")
    args = ap.parse_args(argv)
    header, rows = read(args.csv_gz)
    r = summarise(header, rows, args.min_run, args.top)
    n = max(r["samples"], 1)
    print(f"{r['instructions']} instructions, {r['executed']} executed ({len(r['runs'])} runs), "
          f"{r['samples']} stall samples")
    for name, v in r["stalls"].most_common(8):
        print(f"  {name[6:]:<18} {v:6d}  {100 * v / n:5.1f}%")
    print("runs: first-last  instructions  executed  samples  no_inst  opcodes")
    for run in r["shown"]:
        ops = ", ".join(f"{op} {k}" for op, k in run.ops.most_common(3))
        print(f"  {run.start:5d}-{run.end:<5d} {run.end - run.start + 1:5d} {run.executed:9d} {run.samples:8d} "
              f"{run.no_inst:8d}  {ops}")
    print("busiest instructions: index  samples  source")
    for index, samples, source in r["busiest"]:
        print(f"  {index:5d} {samples:8d}  {source}")

if __name__ == "__main__":
    main()
