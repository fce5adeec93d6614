"""`longctx train` on one model at one process, cp=2 ring and cp=2 Ulysses: the losses of each
step and the largest weight difference after the last step, against one process.

    python scripts/tools/cp_parity.py --model DIR --out WORK [--steps 2] [--seq-len 256] [key=value ...]

DIR is an HF model directory (model.init_from); every run trains on the default data with
`checkpoint.export_hf=true`, and the exports' safetensors are compared. Prints one line per
layout and exits 1 when a loss or a weight differs from one process's by more than --tol
(relative to the largest weight's magnitude for weights).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

LAYOUTS = {"one": (1, []), "cp2-ring": (2, ["parallel.cp_size=2", "parallel.cp_impl=ring"]),
           "cp2-ulysses": (2, ["parallel.cp_size=2", "parallel.cp_impl=ulysses"])}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(nproc: int, overrides: list[str]) -> None:
    launch = ([sys.executable] if nproc == 1 else
              [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_port", str(_port())])
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    res = subprocess.run([*launch, "-m", "longctx", "train", *overrides], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        sys.exit(f"longctx train failed ({' '.join(overrides)}):\n{res.stderr[-3000:]}")


def _losses(run: Path) -> list[float]:
    by_step = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_step[rec["step"]] = rec["loss"]
    return [by_step[k] for k in sorted(by_step)]


def _weights(run: Path) -> dict:
    out = {}
    for f in sorted((run / "hf").glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    base = [f"model.init_from={args.model}", f"data.seq_len={args.seq_len}", f"train.steps={args.steps}",
            "checkpoint.export_hf=true", "log.tensorboard=false", "log.progress=false", *args.overrides]
    results = {}
    for name, (nproc, layout) in LAYOUTS.items():
        _train(nproc, [*base, f"out_dir={out / name}", *layout])
        results[name] = (_losses(out / name), _weights(out / name))
    ref_losses, ref_weights = results["one"]
    scale = max(w.abs().max().item() for w in ref_weights.values())
    ok = True
    for name, (losses, weights) in results.items():
        loss_err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        weight_err = max((weights[k].float() - w.float()).abs().max().item() for k, w in ref_weights.items()) / scale
        ok &= loss_err <= args.tol and weight_err <= args.tol and len(losses) == len(ref_losses)
        print(f"{name:12s} losses {', '.join(f'{x:.5f}' for x in losses)}  "
              f"max rel loss diff {loss_err:.1e}  max weight diff / largest weight {weight_err:.1e}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
