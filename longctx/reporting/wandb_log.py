"""Weights & Biases runs for training (log.wandb) and evaluation (--wandb-project), rank 0 only.

    check_installed("log.wandb")                               # before any work: one error line
    run = open_run(out_dir, project, entity, name, mode, config, keep_id=True)
    log_scalars(run, scalars, step)                            # the tags TensorBoard gets, at step
    log_table(run, "eval/scores", columns, rows)
    run.finish()

A training run keeps its W&B run id in <out_dir>/wandb_run.json, so a resumed job logs into the
same W&B run at the steps it continues from. W&B writes its own files under <out_dir>/wandb/
(offline mode: one offline-run-* directory per job of the run; `wandb sync <out_dir>/wandb/offline-run-*`
uploads them into that one run, in order).
"""
from __future__ import annotations

import importlib.util
import json
import secrets
from pathlib import Path
from typing import Any, Optional

from longctx.base.errors import UserError
from longctx.storage import atomic

MODES = ("online", "offline")
RUN_ID_FILE = "wandb_run.json"


def check_installed(field: str) -> None:
    """A UserError when W&B logging is asked for and the wandb package is missing."""
    if importlib.util.find_spec("wandb") is None:
        raise UserError(f"{field}: W&B logging is set but the wandb package is not installed; "
                        "pip install 'longctx[wandb]' (or wandb), or leave it unset")


def check_mode(field: str, mode: str) -> None:
    if mode not in MODES:
        raise UserError(f"{field}: unknown {mode!r}; valid: {', '.join(MODES)}")


def _run_id(out_dir: Path, keep_id: bool) -> Optional[str]:
    """The run id recorded in out_dir (a resumed run), else a new one recorded there (keep_id)."""
    if not keep_id:
        return None
    path = out_dir / RUN_ID_FILE
    if path.is_file():
        return json.loads(path.read_text())["id"]
    run_id = secrets.token_hex(4)  # 8 characters of [0-9a-f], as W&B's own ids
    atomic.write_json(path, {"id": run_id})
    return run_id


def open_run(out_dir: Path, project: str, entity: Optional[str], name: Optional[str], mode: str,
             config: dict[str, Any], keep_id: bool):
    """A W&B run writing under out_dir/wandb; keep_id: the id in out_dir/wandb_run.json (resumed)."""
    import wandb  # lazy: an optional dependency (check_installed said it is there), slow to import

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run_id = _run_id(out_dir, keep_id)
    return wandb.init(project=project, entity=entity, name=name or out_dir.name, mode=mode, dir=str(out_dir),
                      id=run_id, resume="allow" if run_id else None, config=config)


def log_scalars(run, scalars: dict, step: int) -> None:
    """Tagged numbers (train/<key>, val/<key>, metrics.flat_scalars) at `step`, as TensorBoard gets them."""
    run.log(scalars, step=int(step))


def log_table(run, key: str, columns: list[str], rows: list[list]) -> None:
    import wandb

    run.log({key: wandb.Table(columns=columns, data=rows)})
