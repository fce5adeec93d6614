"""The training job: config -> model -> parallelism -> data -> steps -> checkpoints.

Loss normalisation (why every dp x cp layout gives the same loss and update): with N the
number of real (weighted) label tokens in the whole optimizer step, summed over all ranks and
micro-batches, each rank backpropagates  loss_sum_rank_micro * world * grad_accum / N.
DeepSpeed divides by grad_accum and averages over the world, so the applied gradient is the
gradient of  sum(all token losses) / N  -- the single-device mean.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from longctx.config import TrainConfig, resolved_stages, stage_data_config, stage_model_config, to_yaml, validate_config
from longctx.errors import UserError
from longctx.train.checkpoint import CheckpointError, choose_resume, read_trainer_state, resume_candidates, run_phase
from longctx.train.continuation import continue_from, nothing_left_notice
from longctx.train.metrics import cpu_limit_fraction, measure_cpu_limits
from longctx.train.nonfinite import (NONFINITE_EXIT_CODE, NONFINITE_MARKER, NonFiniteGuard, NonFiniteStop,
                                     backward_factor, optimizer_step_skipped, weights_finite)
from longctx.train.signals import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER
from longctx.train.summary import layout_line, rope_line, weights_line

log = logging.getLogger("longctx.train")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _setup_logging(out_dir: Path, rank: int) -> None:
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(logs / f"rank_{rank:05d}.log")
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    if rank == 0:
        console = logging.StreamHandler(sys.stderr)
        console.setLevel(logging.WARNING)
        root.addHandler(console)


def _all_reduce_sum(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return t.cpu().tolist()


def stage_loader(cfg: TrainConfig, stage_index: int, tokenizer, *, dp_rank: int, dp_size: int):
    """The loader of stage `stage_index`: its seq_len and sources (see stage_data_config), answer
    masks when answer tokens are weighted, and a seed of its own."""
    from longctx.data import build_loader

    stage = resolved_stages(cfg)[stage_index]
    data_cfg = dataclasses.replace(stage_data_config(cfg, stage),
                                   emit_answer_mask=cfg.data.emit_answer_mask or cfg.train.answer_loss_weight != 1.0)
    return build_loader(data_cfg, tokenizer, dp_rank=dp_rank, dp_size=dp_size, seed=cfg.train.seed + 1000 * stage_index)


class Trainer:
    def __init__(self, cfg: TrainConfig):
        from longctx.parallel.mesh import init_distributed, read_env

        self.cfg = cfg
        self.env = read_env()
        validate_config(cfg, self.env.world_size)  # everything cheap, before any process group
        self.stages = resolved_stages(cfg)
        self.out = Path(cfg.out_dir)
        # a bad path fails before any process group; hashes are verified (split over ranks) in run()
        self.resume_candidates = resume_candidates(self.out, cfg.checkpoint.resume)
        init_distributed(preload=("deepspeed",))  # the engine's library, imported before any group
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "resolved_config.yaml").write_text(_resolved_header(cfg) + to_yaml(cfg))
            (self.out / PREEMPTED_MARKER).unlink(missing_ok=True)
            (self.out / NONFINITE_MARKER).unlink(missing_ok=True)
        dist.barrier()
        _setup_logging(self.out, self.rank)
        self.dtype = DTYPES[cfg.train.dtype]
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self._meshes: dict[int, object] = {}
        self.guard = NonFiniteGuard(cfg.train.nonfinite, cfg.train.max_nonfinite_steps)
        self.resume_from: Optional[Path] = None
        self.last_checkpoint: Optional[Path] = None

    # ------------------------------------------------------------------ building blocks
    def _mesh(self, cp: int):
        from longctx.parallel.mesh import build_mesh

        if cp not in self._meshes:
            self._meshes[cp] = build_mesh(cp)
        return self._meshes[cp]

    def _attention(self, cp: int):
        from longctx.attention import get_attention
        from longctx.parallel.cp import make_cp_attention

        par = self.cfg.parallel
        if cp == 1:
            return get_attention(par.attention_backend, self.device)
        mesh = self._mesh(cp)
        ulysses = cp if par.cp_impl == "ulysses" else (par.ulysses_size if par.cp_impl == "hybrid" else None)
        return make_cp_attention(mesh.cp_group, impl=par.cp_impl, ulysses_size=ulysses, backend=par.attention_backend)

    def _build_model(self):
        from longctx.model import build_model
        from longctx.model.config import get_preset
        from longctx.model.hf import load_pretrained, read_hf_config
        from longctx.model.llama import count_parameters
        from longctx.parallel.checkpointing import apply_activation_checkpointing
        from longctx.parallel.compiled import compile_pointwise

        cfg = self.cfg
        model_cfg = stage_model_config(cfg, self.stages[0])
        if cfg.model.init_from:
            model = load_pretrained(cfg.model.init_from, config=model_cfg, device=self.device)
        else:
            model = build_model(model_cfg, device=self.device, seed=cfg.train.seed)
        self._announce(weights_line(cfg.model.init_from, cfg.model.preset, len(model.state_dict()),
                                    count_parameters(model), cfg.train.seed))
        self.model_origin = read_hf_config(cfg.model.init_from) if cfg.model.init_from else get_preset(cfg.model.preset)
        model = model.to(self.dtype)
        apply_activation_checkpointing(model, cfg.parallel.activation_checkpointing, cfg.parallel.checkpoint_every,
                                       recompute_attention=cfg.parallel.recompute_attention)
        compile_pointwise(model, cfg.parallel.compile)
        return model

    def _enter_stage(self, model, index: int) -> None:
        from longctx.model.rope import RotaryEmbedding

        stage = self.stages[index]
        new_cfg = stage_model_config(self.cfg, stage)
        where = f"stage {index} ({stage.name})" if self.cfg.stages else "model"
        self._announce(rope_line(where, self.model_origin if index == 0 else model.config, new_cfg))
        model.config = new_cfg
        model.rotary = RotaryEmbedding(new_cfg.rope_parameters, new_cfg.head_dim, new_cfg.max_position_embeddings)
        cp = stage.cp_size or self.cfg.parallel.cp_size
        model.set_attention(self._attention(cp))
        self.cp = cp
        self.mesh = self._mesh(cp)
        # CPU: this machine's GEMM and attention-kernel rates at the stage's shapes, measured
        # on every rank at once, for the step's cpu_mfu (train/metrics.py)
        self.cpu_limits = (measure_cpu_limits(new_cfg, stage.seq_len, cp_size=cp, dtype=self.dtype, seconds=0.25)
                           if self.device.type == "cpu" else None)
        # unscored row tails are dropped in steps of this many columns: divisible by the zigzag's
        # 2 x cp chunks, and round enough to keep the attention kernels' blocks regular
        self.trim_multiple = math.lcm(64, 2 * cp)

    def _announce(self, line: str) -> None:
        """A line confirming what the run does: in every rank's log, and on rank 0's console."""
        log.info("%s", line)
        if self.rank == 0:
            print(line, file=sys.stderr)

    def close(self) -> None:
        """Release the DeepSpeed engine's hooks and buffers (its documented cleanup): without it
        a ZeRO >= 1 engine, its model and its process groups outlive the job in this process.
        Never raises: teardown must not replace the job's result."""
        engine = getattr(self, "engine", None)
        if engine is None:
            return
        try:
            engine.destroy()
        except Exception as e:  # noqa: BLE001
            log.warning("DeepSpeed engine cleanup failed: %s", e)
        self.engine = None

    # ------------------------------------------------------------------------ the job
    def run(self) -> int:
        from tqdm import tqdm

        from longctx.train.metrics import MetricsWriter, peak_flops_per_device
        from longctx.train.signals import PreemptionFlag

        cfg = self.cfg
        self.resume_from = self.last_checkpoint = choose_resume(self.resume_candidates, cfg.checkpoint.resume)
        continuation = self._continuation()
        if continuation is not None and continuation.stage == len(self.stages):
            return 0  # nothing left to train (the notice is printed)
        torch.manual_seed(cfg.train.seed)
        tokenizer = self._build_engine()
        state = {"step": 0, "tokens": 0, "stage": 0, "stage_step": 0}
        loader_state = self._restore(state, continuation) if continuation is not None else None
        self.writer = MetricsWriter(self.out, self.rank == 0, cfg.log.tensorboard)
        self.peak, self.peak_src = peak_flops_per_device(cfg.log.peak_tflops, self.dtype)
        self.flag = PreemptionFlag().install()
        self.bar = tqdm(total=sum(s.steps for s in self.stages), initial=state["step"], desc="train", unit="step",
                        disable=self.rank != 0 or not cfg.log.progress, dynamic_ncols=True)
        try:
            while state["stage"] < len(self.stages):
                if self._run_stage(state, tokenizer, loader_state) == PREEMPTED_EXIT_CODE:
                    return PREEMPTED_EXIT_CODE
                loader_state = None
            if cfg.checkpoint.export_hf:
                problem = self._write_hf(self.out / "hf")
                if problem:
                    raise CheckpointError(f"checkpoint.export_hf: cannot write {self.out / 'hf'}: {problem}")
            return 0
        finally:
            self.bar.close()
            self.writer.close()
            self.flag.uninstall()

    def _continuation(self):
        """Where a resumed run continues (None: a fresh run); prints the notice when nothing is left."""
        if self.resume_from is None:
            return None
        saved = read_trainer_state(self.resume_from)
        continuation = continue_from(saved, self.stages)
        if continuation.stage == len(self.stages) and self.rank == 0:
            print(nothing_left_notice(self.resume_from, saved, self.stages), file=sys.stderr)
        return continuation

    def _build_engine(self):
        """Tokenizer, model, optimizer and the DeepSpeed engine; returns the tokenizer."""
        from longctx.data import check_vocab, load_tokenizer
        from longctx.parallel.zero import build_optimizer, deepspeed_config, initialize_engine

        cfg, par = self.cfg, self.cfg.parallel
        tokenizer = load_tokenizer(cfg.data.tokenizer)
        model = self._build_model()
        check_vocab(tokenizer, model.config.vocab_size)
        optimizer = build_optimizer(model, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                                    eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
                                    offload=par.offload_optimizer)
        ds_cfg = deepspeed_config(zero_stage=par.zero_stage, micro_batch_size=cfg.data.micro_batch_size,
                                  grad_accum=cfg.train.grad_accum, world_size=self.world, dtype=cfg.train.dtype,
                                  grad_clip=cfg.optim.grad_clip, offload_optimizer=par.offload_optimizer,
                                  offload_params=par.offload_params, user_json=par.deepspeed_config)
        self.engine, _ = initialize_engine(model, optimizer, ds_cfg)
        self.model = model
        cp0 = self.stages[0].cp_size or par.cp_size
        self._announce(layout_line(self.world, self.world // cp0, cp0, par.cp_impl, par.zero_stage,
                                   par.offload_optimizer, cfg.train.dtype, par.activation_checkpointing))
        return tokenizer

    def _restore(self, state: dict, continuation) -> Optional[dict]:
        """Load the resume checkpoint into the engine and `state`; returns the loader state
        when it belongs to the stage the run continues with."""
        from longctx.train.checkpoint import load_checkpoint, set_rng_state

        saved, rank_state = load_checkpoint(self.resume_from, engine=self.engine, world_size=self.world)
        state.update(step=saved["step"], tokens=saved["tokens"], stage=continuation.stage,
                     stage_step=continuation.stage_step)
        set_rng_state(rank_state["rng"])
        log.info("resumed from %s at step %d", self.resume_from, state["step"])
        if continuation.note:
            log.warning("checkpoint.resume: %s", continuation.note)
        return rank_state["data"] if continuation.loader_belongs else None

    def _run_stage(self, state: dict, tokenizer, loader_state: Optional[dict]) -> Optional[int]:
        """Steps of the current stage until it ends (state moves to the next stage) or a
        preemption (returns PREEMPTED_EXIT_CODE after saving)."""
        from longctx.train.metrics import flops_per_token

        si = state["stage"]
        stage = self.stages[si]
        self._enter_stage(self.model, si)
        loader = stage_loader(self.cfg, si, tokenizer, dp_rank=self.mesh.dp_rank, dp_size=self.mesh.dp_size)
        if loader_state is not None:
            loader.load_state_dict(loader_state)
        batches = iter(loader)
        fpt = flops_per_token(self.model.config, stage.seq_len)
        while state["stage_step"] < stage.steps:
            record = self._step(self.engine, batches, stage, state, fpt, self.peak)
            self._account(record, state, si, stage)
            stage_done = state["stage_step"] == stage.steps
            preempt = self.flag.agreed()
            due = self.cfg.checkpoint.every > 0 and state["step"] % self.cfg.checkpoint.every == 0
            if stage_done:
                state["stage"] += 1
                state["stage_step"] = 0
            if due or stage_done or preempt:
                self._save(state, loader.state_dict(), data_stage=si)
            if preempt:
                self._report_preemption(state["step"])
                return PREEMPTED_EXIT_CODE
            if stage_done:
                break
        return None

    def _account(self, record: dict, state: dict, si: int, stage) -> None:
        """Count the step, apply the non-finite policy, advance the bar, log the metrics."""
        state["step"] += 1
        try:
            record["skipped"] = self.guard.observe(state["step"], record["loss"], record["grad_norm"],
                                                   record.pop("update_applied"), self.last_checkpoint)
        except NonFiniteStop:
            self.writer.write(dict(record, step=state["step"], stage=si, skipped=True))
            raise
        state["stage_step"] += 1
        state["tokens"] += record["tokens"]
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{record['loss']:.4f}", stage=si)
        if record["skipped"] or state["step"] % self.cfg.log.every == 0 or state["stage_step"] == stage.steps:
            record.update(step=state["step"], stage=si, tokens_seen=state["tokens"], peak_flops_source=self.peak_src)
            self.writer.write(record)

    def _report_preemption(self, step: int) -> None:
        log.warning("preemption signal %s: checkpoint saved at step %d, exiting with %d",
                    self.flag.received, step, PREEMPTED_EXIT_CODE)
        if self.rank == 0:
            # torchrun reports its own exit code, so launchers can also read this marker
            (self.out / PREEMPTED_MARKER).write_text(f"{step}\n")
            self.bar.write(f"preempted: saved step {step}, exit code {PREEMPTED_EXIT_CODE}")

    def _step(self, engine, batches, stage, state: dict, fpt: float, peak: float) -> dict:
        from longctx.data.packing import trim_unscored_tail
        from longctx.parallel.sharding import shard_batch
        from longctx.train.metrics import peak_memory_bytes
        from longctx.train.schedule import lr_at

        cfg = self.cfg
        t0 = time.perf_counter()
        micro = [next(batches) for _ in range(cfg.train.grad_accum)]
        t_data = time.perf_counter() - t0
        lr = lr_at(state["stage_step"], stage.steps, lr=stage.lr or cfg.optim.lr,
                   warmup_steps=cfg.optim.warmup_steps if stage.warmup_steps is None else stage.warmup_steps,
                   schedule=cfg.optim.schedule, min_lr_ratio=cfg.optim.min_lr_ratio)
        for group in engine.optimizer.param_groups:
            group["lr"] = lr
        prepared = []
        local_weight, columns = 0.0, 0
        for batch in micro:
            inputs = trim_unscored_tail(self._prepare(batch), self.trim_multiple)
            columns += inputs["labels"].shape[1]
            if self.cp > 1:
                inputs = shard_batch(inputs, self.mesh.cp_rank, self.cp)
            weights = inputs.get("loss_weights")
            valid = (inputs["labels"] != -100).float()
            local_weight += float((valid * weights).sum() if weights is not None else valid.sum())
            prepared.append(inputs)
        total_weight, = _all_reduce_sum([local_weight])
        if total_weight <= 0:
            raise UserError("data: a whole optimizer step has no label tokens (all labels ignored)")
        scale = self.world * cfg.train.grad_accum / total_weight
        loss_total, grad_norm, dropped = 0.0, None, False
        for inputs in prepared:
            loss_sum, _ = engine(inputs["input_ids"], position_ids=inputs["position_ids"],
                                 segment_ids=inputs.get("segment_ids"), labels=inputs["labels"],
                                 loss_weights=inputs.get("loss_weights"), loss_chunk_size=cfg.train.loss_chunk_size)
            engine.backward(loss_sum * (scale * backward_factor(loss_sum)))  # see train/nonfinite.py
            if engine.is_gradient_accumulation_boundary() and engine.zero_optimization_stage() == 0:
                grad_norm = _replicated_grad_norm(self.model)  # DeepSpeed does not report it without ZeRO
                # a plain torch optimizer (no bf16/fp16 wrapper) has no overflow check of its own
                dropped = not math.isfinite(grad_norm) and not (engine.bfloat16_enabled() or engine.fp16_enabled())
            with optimizer_step_skipped(engine.optimizer) if dropped else contextlib.nullcontext():
                engine.step()
            loss_total += float(loss_sum.detach())
        global_loss, = _all_reduce_sum([loss_total])
        elapsed = time.perf_counter() - t0
        if grad_norm is None:
            grad_norm = engine.get_global_grad_norm()
        grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        tokens = stage.seq_len * cfg.data.micro_batch_size * cfg.train.grad_accum * self.mesh.dp_size
        tps = tokens / elapsed
        computed = columns / (stage.seq_len * len(micro))  # share of the columns run (unscored tails are not)
        record = {
            "loss": global_loss / total_weight, "lr": lr, "grad_norm": grad_norm, "tokens": tokens,
            "tokens_per_s": tps, "tokens_per_s_per_device": tps / self.world,
            "mfu": fpt * tps * computed / self.world / peak, "computed_fraction": computed,
            "peak_memory_gb": peak_memory_bytes() / 2**30,
            "data_wait_fraction": t_data / elapsed, "step_time_s": elapsed, "seq_len": stage.seq_len,
            "cp_size": self.cp, "dp_size": self.mesh.dp_size,
            "update_applied": not dropped and engine.was_step_applied(),
        }
        if self.cpu_limits is not None:  # cpu_mfu, gemm_limit_s, attention_limit_s
            record.update(cpu_limit_fraction(self.model.config, stage.seq_len, self.cp, elapsed, self.cpu_limits,
                                             sequences=cfg.data.micro_batch_size * cfg.train.grad_accum * computed))
        return record

    def _prepare(self, batch: dict) -> dict:
        from longctx.data.packing import fold_trailing_padding

        out = {k: batch[k].to(self.device) for k in ("input_ids", "labels", "position_ids")}
        if self.cfg.data.document_masking:
            out["segment_ids"] = fold_trailing_padding(batch["segment_ids"], batch["labels"]).to(self.device)
        w = self.cfg.train.answer_loss_weight
        if w != 1.0 and "answer_mask" in batch:
            out["loss_weights"] = 1.0 + (w - 1.0) * batch["answer_mask"].to(self.device).float()
        return out

    # --------------------------------------------------------------------- checkpoints
    def _write_hf(self, path: Path) -> Optional[str]:
        """Collective: rank 0 writes the HF export; returns the agreed failure, or None."""
        from longctx.model.hf import save_hf_weights
        from longctx.parallel.zero import full_state_dict
        state = full_state_dict(self.engine, self.model)  # collective under ZeRO-3

        def write() -> None:
            if self.rank == 0:
                save_hf_weights(state, self.model.config, path, tokenizer=self.cfg.data.tokenizer)

        return run_phase(write)

    def _save(self, state: dict, loader_state: dict, data_stage: int) -> None:
        from longctx.train.checkpoint import rng_state, save_checkpoint

        if not weights_finite(self.model):
            kept = f"last checkpoint: {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint written yet"
            raise NonFiniteStop(f"train: non-finite weights at step {state['step']}; not checkpointed ({kept})",
                                state["step"])
        # stage_steps / data_stage: how a resume with a changed config continues (train/continuation.py)
        trainer_state = dict(state, world_size=self.world, cp_size=self.cp, dp_size=self.mesh.dp_size,
                             stage_steps=[s.steps for s in self.stages], data_stage=data_stage)
        rank_state = {"data": loader_state, "rng": rng_state()}
        self.last_checkpoint = save_checkpoint(
            self.out, state["step"], engine=self.engine, trainer_state=trainer_state, rank_state=rank_state,
            keep_last=self.cfg.checkpoint.keep_last, hf_writer=self._write_hf if self.cfg.checkpoint.save_hf else None)


def _replicated_grad_norm(model) -> float:
    """L2 norm of the (already all-reduced, replicated) gradients, before clipping."""
    norms = [p.grad.detach().float().norm() for p in model.parameters() if p.grad is not None]
    return float(torch.stack(norms).norm()) if norms else 0.0


def _resolved_header(cfg: TrainConfig) -> str:
    """Comments that say where the model's architecture comes from (the preset field stays in
    the YAML, so the file loads back, but an init_from checkpoint's config.json wins)."""
    if cfg.model.init_from:
        return (f"# model: architecture and weights from model.init_from={cfg.model.init_from} (its config.json); "
                f"model.preset ({cfg.model.preset}) is not used\n")
    return f"# model: preset {cfg.model.preset}, random init (train.seed {cfg.train.seed})\n"


def _report_stop(trainer: Trainer, stop: NonFiniteStop) -> int:
    """One line on rank 0 (every rank agrees on the stop), the marker for launchers, the code."""
    if trainer.rank == 0:
        log.info("stopped: %s", stop)  # the console gets the error line below, the log file this
        print(f"error: {stop}", file=sys.stderr)
        (trainer.out / NONFINITE_MARKER).write_text(f"{stop.step}\n")
    else:
        log.error("%s", stop)
    return NONFINITE_EXIT_CODE


def train(cfg: TrainConfig) -> int:
    from longctx.parallel.mesh import shutdown_distributed

    trainer = Trainer(cfg)
    completed = False
    try:
        try:
            rc = trainer.run()
        except NonFiniteStop as e:
            rc = _report_stop(trainer, e)
        except CheckpointError as e:  # every rank raises it together; the CLI prints rank 0's
            completed = True
            if trainer.rank == 0:
                raise
            log.error("%s", e)
            return 2
        completed = True
        return rc
    finally:
        trainer.close()
        shutdown_distributed(completed)
