"""Per-file table of where the suite's time goes, from the records helpers/suite_profile.py writes.

    .venv/bin/python -m pytest -p helpers.suite_profile ...      # writes .pytest_cache/suite_profile.jsonl
    .venv/bin/python scripts/tools/suite_table.py [PROFILE.jsonl] [--json OUT.json] [--top N]
    .venv/bin/python scripts/tools/suite_table.py --slowest 10 --wall-s 1500   # what ./run.sh test prints last
    .venv/bin/python scripts/tools/suite_table.py --write-durations tests/durations.json  # the order files start in

Columns: wall time of the file's tests; their CPU time (the test process's and its finished
children's: it grows with the machine's load too, but far less than wall time); the processes
they started (subprocess and multiprocessing); the time the test process slept (time.sleep)
and the time it was blocked on a child (Popen.wait/communicate). Sleep and wait overlap with a
child's own work: they say how much of the wall time the test process itself was idle, not
that the time was wasted."""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def per_file(records: list[dict]) -> list[dict]:
    files: dict[str, dict] = defaultdict(lambda: {"tests": 0, "wall_s": 0.0, "cpu_s": 0.0, "processes": 0,
                                                  "sleep_s": 0.0, "wait_s": 0.0})
    for record in records:
        row = files[record["nodeid"].split("::")[0]]
        row["tests"] += 1
        for key in ("wall_s", "cpu_s", "processes", "sleep_s", "wait_s"):
            row[key] += record.get(key, 0.0)
    rows = [{"file": name, **{k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}}
            for name, row in files.items()]
    return sorted(rows, key=lambda r: -r["wall_s"])


def markdown(rows: list[dict], top: int) -> str:
    total, cpu = sum(r["wall_s"] for r in rows), sum(r["cpu_s"] for r in rows)
    lines = [f"{len(rows)} files, {sum(r['tests'] for r in rows)} tests, {total / 60:.1f} min of test time "
             f"(summed over files; workers in parallel make the wall time shorter), {cpu / 60:.1f} min of CPU", "",
             "| file | tests | wall s | CPU s | processes | asleep s | on a child s |", "|---|---|---|---|---|---|---|"]
    for r in rows[:top]:
        lines.append(f"| `{r['file']}` | {r['tests']} | {r['wall_s']:.0f} | {r['cpu_s']:.0f} | {r['processes']} | "
                     f"{r['sleep_s']:.0f} | {r['wait_s']:.0f} |")
    return "\n".join(lines)


def slowest(records: list[dict], count: int, wall_s: float | None) -> str:
    """The run's wall time and its `count` slowest tests, the lines ./run.sh test ends with."""
    lines = []
    if wall_s is not None:
        lines.append(f"suite wall time: {wall_s / 60:.1f} min ({len(records)} tests; budget: 30 min on 2 idle cores, "
                     f"45 at load 5: tests/README.md)")
    lines.append(f"the {count} slowest tests:")
    for record in sorted(records, key=lambda r: -r["wall_s"])[:count]:
        lines.append(f"  {record['wall_s']:7.1f} s  {record['nodeid']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", nargs="?", default=".pytest_cache/suite_profile.jsonl")
    parser.add_argument("--json", help="also write the per-file rows as JSON")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--slowest", type=int, default=0, help="print the wall time and the N slowest tests instead")
    parser.add_argument("--wall-s", type=float, default=None, help="the run's wall time, for --slowest")
    parser.add_argument("--write-durations", help="write {file: seconds} for tests/conftest.py's ordering "
                        "(files absent from this profile keep their old entry)")
    args = parser.parse_args(argv)
    path = Path(args.profile)
    if not path.is_file():
        print(f"error: profile: {path} does not exist (run pytest with -p helpers.suite_profile)", file=sys.stderr)
        return 2
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if args.slowest:
        print(slowest(records, args.slowest, args.wall_s))
        return 0
    rows = per_file(records)
    if args.write_durations:
        target = Path(args.write_durations)
        old = json.loads(target.read_text()) if target.is_file() else {}
        new = {**old, **{r["file"]: r["wall_s"] for r in rows}}
        target.write_text(json.dumps(dict(sorted(new.items(), key=lambda kv: -kv[1])), indent=1) + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(markdown(rows, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
