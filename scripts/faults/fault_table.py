"""Run the faults a team's hundredth job meets, on tiny CPU runs, and print the table of what
happens: each case, its command, the exit code, the line it prints, what is on disk after.

    python scripts/faults/fault_table.py                 # every case (several minutes on 2 cores)
    python scripts/faults/fault_table.py -k export       # the cases whose title contains "export"
    python scripts/faults/fault_table.py --out docs/faults.md

Each case works in its own temporary directory and cleans up after itself. Cases that fill a
disk mount a small tmpfs and need root; without it they are listed as skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from pathlib import Path
from typing import Optional

import fault_cases_data  # noqa: F401, I001
import fault_cases_outputs  # noqa: F401, I001
import fault_cases_train  # noqa: F401  (registers its cases; the table keeps this order)
from fault_kit import CASES, TINY_YAML, Row


# ------------------------------------------------------------------------------- table
def markdown(rows: list[Row]) -> str:
    def cell(text) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    lines = ["| case | command | exit | what it prints | on disk after |", "|---|---|---|---|---|"]
    lines += [f"| {cell(r.case)} | `{cell(r.command)}` | {cell(r.rc)} | {cell(r.line)} | {cell(r.on_disk)} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-k", default="", help="only the cases whose title contains this")
    p.add_argument("--out", type=Path, default=None, help="also write the table (markdown) here")
    args = p.parse_args(argv)
    chosen = [(t, fn) for t, fn in CASES if args.k.lower() in t.lower()]
    if not chosen:
        print(f"error: -k: no case matches {args.k!r}; cases: {'; '.join(t for t, _ in CASES)}", file=sys.stderr)
        return 2
    rows = []
    for i, (title, fn) in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {title}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="longctx-fault-") as tmp:
            (Path(tmp) / "tiny.yaml").write_text(TINY_YAML)
            row = fn(Path(tmp))
            rows.append(dataclasses.replace(row, line=row.line.replace(f"{tmp}/", "")))
    table = markdown(rows)
    print(table, end="")
    if args.out is not None:
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
