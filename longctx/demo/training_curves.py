"""The demo report's section on what the extension's validation saw while it trained: the
held-out loss by position (first and last validation) and the retrieval probe (every
validation), with the two pictures the trainer drew (extend/validation.png, extend/probe.png)."""
from __future__ import annotations

from pathlib import Path

from longctx.train.validation_plot import PICTURE, PROBE_PICTURE, read_rows


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def training_section(run_dir: Path, rel: str, train_len: int) -> list[str]:
    """report.md lines for the extension run at `run_dir` (`rel`: its path from the report);
    empty when it has no validation row."""
    rows = read_rows(run_dir)
    if not rows:
        return []
    first, last = rows[0], rows[-1]
    lines = ["## While the extension trained (validation)", "",
             f"{len(rows)} validations (steps {', '.join(str(r['step']) for r in rows)}) on "
             f"{last.get('val_rows', '?')} held-out rows of {last['seq_len']} tokens: the mean loss of the "
             f"tokens in each position bucket (nats/token); positions past {train_len} are beyond the base "
             "model's context.", "",
             "| bucket | " + " | ".join(f"step {r['step']}" for r in (first, last)) + " |", "|---|---:|---:|"]
    for label in first["val_loss_by_position"]:
        lines.append(f"| {label} | " + " | ".join(_fmt(r["val_loss_by_position"].get(label)) for r in (first, last))
                     + " |")
    lines += ["", f"![loss by position]({rel}/{PICTURE})", ""]
    if isinstance(last.get("probe"), dict):
        cells = [(task, length) for task, by_length in last["probe"].items() for length in by_length]
        lines += [f"Retrieval probe (teacher-forced, {last.get('probe_samples', '?')} samples per task and length) at "
                  "every validation: score 0-100 / share of answer tokens that are the argmax.", "",
                  "| step | " + " | ".join(f"{task} @ {length}" for task, length in cells) + " |",
                  "|---:|" + "---:|" * len(cells)]
        for r in rows:
            probe, tokens = r.get("probe") or {}, r.get("probe_token_accuracy") or {}
            lines.append(f"| {r['step']} | " + " | ".join(
                f"{_fmt(probe.get(task, {}).get(length))} / {_fmt(tokens.get(task, {}).get(length))}"
                for task, length in cells) + " |")
        lines += ["", f"![probe]({rel}/{PROBE_PICTURE})", ""]
    return lines
