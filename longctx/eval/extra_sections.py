"""A section beyond the cells (lm-eval's tasks, MRCR) added to an eval's results.json and
report.md: the section under its key, the report's table from its heading on replaced, each file
rewritten by a rename."""
from __future__ import annotations

import json
from pathlib import Path

from longctx.storage import atomic


def add_section(out: Path, key: str, section: dict, heading: str, table: str) -> None:
    """results.json[key] = section; report.md from `heading` on becomes `table` (which starts with
    that heading)."""
    results = json.loads((out / "results.json").read_text())
    results[key] = section
    atomic.write_json(out / "results.json", results)
    report = (out / "report.md").read_text()
    marker = "\n" + heading
    if marker in report:
        report = report[:report.index(marker)]
    atomic.write_text(out / "report.md", report.rstrip("\n") + "\n\n" + table)
