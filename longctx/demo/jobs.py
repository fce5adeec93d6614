"""The demo's training jobs: a DemoConfig turned into the TrainConfigs of its jobs, written
into the run directory and run as real `longctx train` processes (one process for the base
model; `torchrun` with 2 ranks, cp=2 and ZeRO-3 for the extension), so each step can be
re-run by hand from its YAML.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from longctx.base.errors import UserError
from longctx.checkpoint.find import tokenizer_spec_for
from longctx.config import (
    CheckpointSection,
    LogSection,
    ModelSection,
    OptimSection,
    ParallelSection,
    StageSection,
    TrainConfig,
    TrainSection,
    load_config,
    to_yaml,
)
from longctx.config import check_out_dir as check_writable_dir
from longctx.config.adapter import AdapterSection
from longctx.config.probe import ProbeSection
from longctx.config.validation import ValidationSection
from longctx.data.config import DataConfig
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.data.source_config import SourceConfig
from longctx.data.synthetic_config import SyntheticConfig
from longctx.demo.config import DemoConfig
from longctx.model.hf import load_pretrained, save_pretrained
from longctx.model.hf_config import read_hf_config


def _synthetic(num_keys: int, length_min_ratio: float, filler: str, tasks: Dict[str, float], num_values: int,
               queries: int = 1, recall_multivalue: float = 0.0, line_breaks: float = 0.0,
               packing: str = "pad") -> SourceConfig:
    # compact style = the eval suite's compact prompts word for word (needles, question,
    # answer prefix); filler per config (noise = RULER's passage, the niah_single_1 / passkey
    # haystack); documents are never split across rows (pad / fit packing)
    return SourceConfig(name="synthetic", kind="synthetic", packing=packing, synthetic=SyntheticConfig(
        style="compact", filler=filler, num_keys=num_keys, num_values=num_values, length_min_ratio=length_min_ratio,
        queries=queries, recall_multivalue=recall_multivalue, line_breaks=line_breaks, tasks=dict(tasks)))


def base_synthetic(demo: DemoConfig, tasks: Optional[Dict[str, float]] = None) -> SourceConfig:
    return _synthetic(demo.num_keys, demo.length_min_ratio, demo.filler, tasks or demo.tasks, demo.num_values,
                      recall_multivalue=demo.recall_multivalue, line_breaks=demo.line_breaks)


def extend_synthetic(demo: DemoConfig) -> SourceConfig:
    return _synthetic(demo.extend_num_keys, demo.extend_length_min_ratio, demo.extend_filler,
                      demo.extend_tasks, demo.num_values, queries=demo.extend_queries,
                      recall_multivalue=demo.extend_recall_multivalue, line_breaks=demo.extend_line_breaks,
                      packing=demo.extend_packing)


def _optim(lr: float, warmup: int) -> OptimSection:
    return OptimSection(lr=lr, warmup_steps=warmup, schedule="cosine", min_lr_ratio=0.1, weight_decay=0.0,
                        grad_clip=1.0)


def base_config(demo: DemoConfig, out_dir: Path, seed: int, tokenizer) -> TrainConfig:
    """Step 1: a fresh model trained at train_len with a length curriculum. `tokenizer`: the
    loaded tokenizer (sizes the vocabulary); its name ("byte" or the tokenizer.json path) is
    the config's data.tokenizer."""
    stages = [StageSection(name=s.name, seq_len=s.seq_len, steps=s.steps,
                           warmup_steps=demo.base_warmup if i == 0 else 0,
                           sources=[base_synthetic(demo, s.tasks)] if s.tasks else None)
              for i, s in enumerate(demo.base_stages)]
    return TrainConfig(
        out_dir=str(out_dir),
        model=ModelSection(preset="debug-tiny", overrides=demo.model_overrides(tokenizer),
                           rope_parameters=demo.base_rope(), max_position_embeddings=demo.train_len),
        data=DataConfig(seq_len=demo.train_len, micro_batch_size=demo.base_batch // demo.base_nproc,
                        tokenizer=tokenizer.name, sources=[base_synthetic(demo)]),
        parallel=ParallelSection(compile=demo.base_compile),
        optim=_optim(demo.base_lr, demo.base_warmup),
        train=TrainSection(dtype=demo.dtype, seed=seed, answer_loss_weight=demo.answer_loss_weight),
        checkpoint=CheckpointSection(every=0, keep_last=1, save_hf=False, export_hf=True),
        log=LogSection(tensorboard=True, progress=True),
        stages=stages)


def extend_config(demo: DemoConfig, out_dir: Path, init_from: Path, seed: int, rope: Dict[str, Any],
                  tokenizer, adapter: Optional[AdapterSection] = None) -> TrainConfig:
    """Step 3: continued pretraining at factor x train_len from the base model's HF export,
    with new RoPE parameters, 2 ranks with context parallelism (cp=2) and ZeRO-3; validation
    (loss by position, the retrieval probe at its lengths) every few steps. With `adapter`
    (step 5), the same job training only the adapter and its trainable modules."""
    return TrainConfig(
        out_dir=str(out_dir),
        model=ModelSection(init_from=str(init_from), rope_parameters=dict(rope),
                           max_position_embeddings=demo.extend_len),
        data=DataConfig(seq_len=demo.extend_len, micro_batch_size=demo.extend_batch, tokenizer=tokenizer.name,
                        sources=[extend_synthetic(demo)]),
        parallel=ParallelSection(cp_size=demo.cp_size, cp_impl="ring", zero_stage=demo.zero_stage),
        optim=_optim(demo.extend_lr, demo.extend_warmup),
        train=TrainSection(steps=demo.extend_steps, dtype=demo.dtype, seed=seed,
                           answer_loss_weight=demo.answer_loss_weight, adapter=adapter),
        checkpoint=CheckpointSection(every=demo.extend_checkpoint_every, keep_last=2, save_hf=True, export_hf=True),
        log=LogSection(tensorboard=True, progress=True),
        validation=ValidationSection(every=demo.extend_validation_every, rows=demo.validation_rows,
                                     probe=ProbeSection(tasks=list(demo.probe_tasks), samples=demo.probe_samples,
                                                        lengths=[str(n) for n in demo.probe_lengths],
                                                        seed=demo.eval_seed, style="compact")))


def write_config(cfg: TrainConfig, path: Path) -> Path:
    """Write a training config and read it back with the trainer's own loader."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_yaml(cfg))
    load_config(str(path))  # raises UserError on anything the trainer would refuse
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(config: Path, nproc: int) -> list[str]:
    if nproc == 1:
        return [sys.executable, "-m", "longctx", "train", "--config", str(config)]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(_free_port()), "-m", "longctx", "train", "--config", str(config)]


def _env(threads: int) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a demo started inside another job must not join its process group
    return env


def _write(data: bytes) -> None:
    buffer = getattr(sys.stderr, "buffer", None)
    if buffer is not None:
        buffer.write(data)
    else:  # a replaced stderr without a byte buffer
        sys.stderr.write(data.decode(errors="replace"))
    sys.stderr.flush()


class _ConsoleFilter:
    """Pass a child's output to our stderr, minus third-party deprecation warnings (they stay
    in the log file). Complete lines are filtered; a partial line ending in \\r (a progress
    bar redraw) is passed through at once."""

    NOISE = (b"FutureWarning", b"UserWarning", b"DeprecationWarning", b"return func(*args, **kwargs)",
             b"warnings.warn(", b"Setting accelerator to CPU", b"deepspeed_shm_comm_op built successfully")

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        out = b"".join(line + b"\n" for line in lines if not any(n in line for n in self.NOISE))
        cut = self.buf.rfind(b"\r")
        if cut >= 0:
            out, self.buf = out + self.buf[:cut + 1], self.buf[cut + 1:]
        if out:
            _write(out)

    def flush(self) -> None:
        if self.buf and not any(n in self.buf for n in self.NOISE):
            _write(self.buf)
        self.buf = b""


def stop_job(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """Interrupted (Ctrl-C, SIGTERM) while a job runs: stop it instead of orphaning it.
    SIGTERM lets torchrun stop its ranks (each saves a checkpoint and exits); SIGKILL after
    grace_s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_training(config: Path, out_dir: Path, nproc: int, log_name: str, threads: Optional[int] = None) -> None:
    """Run `longctx train` (under torchrun when nproc > 1); the trainer's progress bar goes to
    the terminal, everything to <out_dir>/<log_name>. Raises RuntimeError on failure."""
    cmd = train_command(config, nproc)
    threads = threads or max(1, (os.cpu_count() or 2) // nproc)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / log_name
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(threads))
        assert proc.stdout is not None
        console = _ConsoleFilter()
        try:
            # tee: the trainer writes its tqdm bar to stderr (merged here); pass bytes through as
            # they come so the bar redraws in place
            for chunk in iter(lambda: proc.stdout.read1(4096), b""):  # type: ignore[attr-defined]
                console.feed(chunk)
                log.write(chunk.decode(errors="replace"))
            console.flush()
            rc = proc.wait()
        finally:
            stop_job(proc)
    if rc != 0:
        raise RuntimeError(f"`{' '.join(cmd[-4:])}` exited with code {rc}; see {log_path}")
    if not (out_dir / "hf" / "config.json").is_file():
        raise RuntimeError(f"training finished without an HF export in {out_dir / 'hf'}; see {log_path}")


def save_scaled_only(base_hf: Path, out: Path, rope: Dict[str, Any], max_position_embeddings: int) -> Path:
    """Variant (b): the base weights unchanged, only the RoPE scaling switched on."""
    cfg = read_hf_config(base_hf).replace(rope_parameters=dict(rope), max_position_embeddings=max_position_embeddings)
    model = load_pretrained(base_hf, config=cfg)
    save_pretrained(model, out, tokenizer=TokenizerFiles(tokenizer_spec_for(base_hf, None)))  # "byte", or its files
    return out


def check_out_dir(out: Path, marker: str) -> None:
    """Refuse to write into a non-empty directory that is not a previous demo run."""
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not (out / marker).is_file():
        raise UserError(f"--out: {out} is not empty and not a demo run directory; choose another --out")
    check_writable_dir(str(out), "--out")
