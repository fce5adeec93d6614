"""Run the real trainer in subprocesses (torchrun for several ranks) and read its outputs."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

VENV_BIN = Path(sys.executable).parent
# what torchrun and SLURM jobs set for their ranks; a test's processes start without them
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_cmd(nproc: int, overrides: list[str]) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "longctx", "train", *overrides]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(free_port()), "-m", "longctx", "train", *overrides]


def env() -> dict:
    e = dict(os.environ)
    e.setdefault("OMP_NUM_THREADS", "1")
    e["PYTHONUNBUFFERED"] = "1"
    for key in LAUNCHER_VARS:
        e.pop(key, None)
    return e


def run_train(nproc: int, overrides: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(nproc, overrides), capture_output=True, text=True, timeout=timeout, env=env())


def start_train(nproc: int, overrides: list[str], log_path: Path, environ: dict | None = None) -> subprocess.Popen:
    """`environ`: the processes' environment (default: env())."""
    log = open(log_path, "w")
    return subprocess.Popen(train_cmd(nproc, overrides), stdout=log, stderr=subprocess.STDOUT,
                            env=env() if environ is None else environ, start_new_session=True)


def metrics(out_dir: Path) -> list[dict]:
    """Records of metrics.jsonl; when a step was logged twice (a resumed run), the last wins."""
    by_step: dict[int, dict] = {}
    for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_step[rec["step"]] = rec
    return [by_step[k] for k in sorted(by_step)]


def losses(out_dir: Path) -> list[float]:
    return [r["loss"] for r in metrics(out_dir)]


TINY = ["data.micro_batch_size=2", "data.shuffle=false", "log.tensorboard=false", "log.progress=false",
        "checkpoint.save_hf=false", "checkpoint.export_hf=false"]
