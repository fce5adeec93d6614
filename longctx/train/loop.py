"""The training job, top to bottom: build (model, parallelize, engine) -> per stage (enter it,
its loader, its steps) -> checkpoints -> the HF export. The step itself is train/step.py; what
a checkpoint holds and how a run resumes from one is longctx/checkpoint/ (resume.py)."""
from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from longctx.base.errors import UserError
from longctx.checkpoint.resume import ResumePoint, choose_resume, restore, resume_candidates, resume_point
from longctx.checkpoint.state import TrainerState, TrainState
from longctx.checkpoint.store import CheckpointError, read_trainer_state, rng_state, run_phase, save_checkpoint
from longctx.config import RunPlan, RunStage, TrainConfig
from longctx.config.probe import original_context
from longctx.config.validation import bucket_ends
from longctx.data import check_vocab, load_tokenizer
from longctx.data.fingerprint import fingerprint_sources
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.data.loader import ModelInputs
from longctx.model.hf import save_hf_weights
from longctx.parallel.mesh import build_mesh, init_distributed, shutdown_distributed
from longctx.parallel.parallelize import attention_for, parallel_engine
from longctx.parallel.zero import full_state_dict
from longctx.reporting.progress import Progress
from longctx.reporting.wandb_log import open_run
from longctx.runtime.launch_env import read_env
from longctx.runtime.watchdog import Watchdog, is_collective_timeout, watched_batches
from longctx.train import run_lock
from longctx.train.build import (
    build_plain_model,
    deepspeed_config_for,
    optimizer_for,
    plan_for,
    setup_logging,
    train_dtype,
)
from longctx.train.cpu_dtype import slow_dtype_note
from longctx.train.metrics import MetricsWriter, progress_fields
from longctx.train.mfu import peak_flops_per_device
from longctx.train.nonfinite import NonFiniteGuard, NonFiniteStop, report_stop, weights_finite
from longctx.train.run_files import changed_resumed_sources, take_run_lock, write_run_files
from longctx.train.schedule import lr_at
from longctx.train.signals import PREEMPTED_EXIT_CODE, PREEMPTED_MARKER, PreemptionFlag
from longctx.train.stages import build_stage_loader, check_sources
from longctx.train.step import StepSetup, train_step
from longctx.train.step_metrics import StepRates, stage_rates, step_record
from longctx.train.summary import RunTotals, end_summary, layout_line, rope_line
from longctx.train.validation import Validator, check_resumed_heldout
from longctx.train.validation_plot import plot_probe, plot_validation

log = logging.getLogger("longctx.train")


@dataclasses.dataclass(frozen=True)
class StageRun:
    """What the steps of one stage run with: its mesh, step setup and metric rates."""
    mesh: object  # parallel.mesh.Mesh
    setup: StepSetup
    rates: StepRates


@dataclasses.dataclass(frozen=True)
class Outputs:
    """Where a running job reports: the metrics writer and the progress display."""
    writer: MetricsWriter
    progress: Progress


class Trainer:
    def __init__(self, cfg: TrainConfig, plan: Optional[RunPlan] = None):
        self.start_time = time.monotonic()  # the end summary's wall time
        # from here a SIGTERM/SIGUSR1 stops the run at its next safe point (before the process's
        # first statement too: longctx/runtime/startup.py recorded it); start-up checks in run()
        self.flag = PreemptionFlag().install()
        try:
            self._set_up(cfg, plan)
        except BaseException:
            self.flag.uninstall()
            raise

    def _set_up(self, cfg: TrainConfig, plan: Optional[RunPlan]) -> None:
        self.cfg = cfg
        self.env = read_env()
        self.plan = plan_for(cfg, plan, self.env.world_size)
        self.stages = self.plan.stages
        self.out = Path(cfg.out_dir)
        self.validator = Validator(cfg.validation, self.stages, loss_chunk_size=cfg.train.loss_chunk_size,
                                   originals=[original_context(m, self.plan.origin) for m in self.plan.model_configs],
                                   multiples=[self.plan.trim_multiple(i) for i in range(len(self.stages))])
        # a bad path fails before any process group; hashes are verified (split over ranks) in run()
        self.resume_candidates = resume_candidates(self.out, cfg.checkpoint.resume)
        check_sources(self.stages)  # every source readable, before out_dir is touched
        self._check_probe()  # probe samples fit every stage, before out_dir is touched
        # the engine's library, imported before any group
        init_distributed(timeout_s=cfg.parallel.startup_timeout_s, preload=("deepspeed",))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.lock = take_run_lock(self.out, self.rank)  # before anything in out_dir is written
        setup_logging(self.out, self.rank)
        self.watchdog = Watchdog(rank=self.rank, world=self.world, timeout_s=cfg.parallel.timeout_s,
                                 startup_timeout_s=cfg.parallel.startup_timeout_s,
                                 log_path=self.out / "logs" / f"rank_{self.rank:05d}.log", marker_dir=self.out,
                                 on_end=self._release_lock).start()
        self.dtype = train_dtype(cfg)
        self.device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                       else torch.device("cpu"))
        self._meshes: dict[int, object] = {}
        self.guard = NonFiniteGuard(cfg.train.nonfinite, cfg.train.max_nonfinite_steps)
        self.resume_from: Optional[Path] = None
        self.restart_sources: set = set()
        self._source_fingerprints: dict[int, list] = {}
        self.last_checkpoint: Optional[Path] = None
        self.pending_validation: Optional[tuple] = None  # (stage, step) a signal stopped before the checkpoint
        self.peak, self.peak_src = peak_flops_per_device(cfg.log.peak_tflops, self.dtype)  # a table, or a cache
        # built by run(), in this order: the engine and its model (_build_engine), then the outputs
        self.engine = self.model = self.outputs = None

    def _check_probe(self) -> None:
        """Build every stage's probe rows now (kept for the validations): a length below a
        task's minimum, or a row beyond its stage, is one error line before anything runs."""
        if self.validator.section.enabled and self.validator.section.probe.enabled:
            tokenizer = load_tokenizer(self.cfg.data.tokenizer)
            for si in range(len(self.stages)):
                self.validator.probe_items(si, tokenizer)

    # ------------------------------------------------------------------------ the job
    def run(self) -> int:
        cfg = self.cfg
        if self._preempted_in_startup():  # a signal during the imports, the rendezvous or the lock
            return PREEMPTED_EXIT_CODE
        self.resume_from = self.last_checkpoint = choose_resume(self.resume_candidates, cfg.checkpoint.resume)
        self.restart_sources = changed_resumed_sources(self.resume_from, self.stages)
        check_resumed_heldout(self.resume_from, self.stages, self.validator, cfg.data.allow_changed_sources)
        if self._preempted_in_startup():  # ... during the checkpoint's verification
            return PREEMPTED_EXIT_CODE
        write_run_files(self.out, self.rank, cfg)
        point = resume_point(self.resume_from, self.stages, model_config=self.plan.model_configs[0],
                             world_size=self.world, grad_accum=cfg.train.grad_accum, rank=self.rank)
        if point is not None and point.finished:
            return 0  # nothing left to train (the notice is printed)
        torch.manual_seed(cfg.train.seed)
        tokenizer = self._build_engine()
        if self._preempted_in_startup():  # ... while the model and the engine were built
            return PREEMPTED_EXIT_CODE
        state = TrainState()
        loader_state = self._restore(point, state, tokenizer) if point is not None else None
        if self._preempted_in_startup():  # ... while the checkpoint loaded (from here: the step loop's check)
            return PREEMPTED_EXIT_CODE
        totals = RunTotals(first_step=state.step, first_tokens=state.tokens)
        self._open_outputs(state.step)
        rc = 0
        try:
            if point is not None and self._redo_validation(tokenizer) == PREEMPTED_EXIT_CODE:
                rc = PREEMPTED_EXIT_CODE
            while rc == 0 and state.stage < len(self.stages):
                if self._run_stage(state, tokenizer, loader_state, totals) == PREEMPTED_EXIT_CODE:
                    rc = PREEMPTED_EXIT_CODE
                    break
                loader_state = None
            totals.train_seconds = time.monotonic() - totals.loop_start
            if rc == 0 and cfg.checkpoint.export_hf:
                with self.watchdog.slow_phase("export"):
                    problem = self._write_hf(self.out / "hf")
                if problem:
                    raise CheckpointError(f"checkpoint.export_hf: cannot write {self.out / 'hf'}: {problem}")
                totals.export = self.out / "hf"
        finally:
            self._close_outputs()
        self._plot_validation()
        totals.step, totals.tokens, totals.last_checkpoint = state.step, state.tokens, self.last_checkpoint
        self._print_summary(totals, preempted=rc == PREEMPTED_EXIT_CODE)
        return rc

    def _open_outputs(self, start_step: int) -> None:
        """Metrics writer and the progress display (a bar on a terminal, a plain line every 30 s
        or 10% of the steps elsewhere)."""
        cfg = self.cfg
        writer = MetricsWriter(self.out, self.rank == 0, cfg.log.tensorboard, start_step=start_step,
                               notify=self._announce, wandb_run=self._wandb_run())
        if self.rank == 0 and (note := slow_dtype_note(self.dtype, self.device)):
            self._announce(note)
        self.outputs = Outputs(writer, Progress(sum(s.steps for s in self.stages), "train", "step", initial=start_step,
                                                enabled=self.rank == 0 and cfg.log.progress))

    def _wandb_run(self):
        """Rank 0's W&B run (log.wandb), with the resolved config; a resumed run keeps its id."""
        w = self.cfg.log.wandb
        if w is None or self.rank != 0:
            return None
        return open_run(self.out, w.project, w.entity, w.name, w.mode, dataclasses.asdict(self.cfg), keep_id=True)

    def _close_outputs(self) -> None:
        outputs, self.outputs = self.outputs, None
        outputs.progress.close()
        outputs.writer.close()

    def _plot_validation(self) -> None:
        """Rank 0: validation.png (and probe.png) beside the metrics; a failed picture is a
        warning, not a failed run."""
        if self.rank != 0 or not self.cfg.validation.enabled:
            return
        try:
            if (path := plot_validation(self.out)) is not None:
                self._announce(f"validation: loss by position in {path}")
            if (path := plot_probe(self.out)) is not None:
                self._announce(f"validation: probe scores in {path}")
        except Exception as e:  # noqa: BLE001 - the run's results are written already
            log.warning("validation: no picture (%s)", e)

    def _print_summary(self, totals: RunTotals, preempted: bool) -> None:
        """The run's last lines on rank 0: steps, final loss, times, throughput, where its
        checkpoint and export are (also in every rank's log)."""
        totals.wall_seconds = time.monotonic() - self.start_time
        text = end_summary(totals, self.out, stages=len(self.stages), preempted=preempted)
        log.info("%s", text)
        if self.rank == 0:
            print(text, file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ building blocks
    def _mesh(self, cp: int):
        if cp not in self._meshes:
            self._meshes[cp] = build_mesh(cp, self.watchdog.collective_timeout_s())
        return self._meshes[cp]

    def _build_engine(self):
        """Tokenizer, model, optimizer and the DeepSpeed engine (parallel_engine); returns the tokenizer."""
        cfg, par = self.cfg, self.stages[0].parallel
        tokenizer = load_tokenizer(cfg.data.tokenizer)
        model, weights = build_plain_model(cfg, self.plan.model_configs[0], self.device)  # init_from or seeded
        self._announce(weights)
        check_vocab(tokenizer, model.config.vocab_size)
        self.engine = parallel_engine(model, self._mesh(par.cp_size), par, device=self.device,
                                      optimizer=optimizer_for(model, cfg.optim, par.offload_optimizer),
                                      ds_config=deepspeed_config_for(cfg, self.world, self.plan.deepspeed))
        self.model = model
        self._announce(layout_line(self.world, self.world // par.cp_size, par.cp_size, par.cp_impl, par.zero_stage,
                                   par.offload_optimizer, cfg.train.dtype, par.activation_checkpointing))
        return tokenizer

    def _restore(self, point: ResumePoint, state: TrainState, tokenizer) -> Optional[dict]:
        """The checkpoint into the engine and `state` (checkpoint/resume.py); the loader state
        when it belongs to the stage the run continues with."""
        stage = self.stages[point.continuation.stage]
        mesh = self._mesh(stage.parallel.cp_size)
        return restore(point, engine=self.engine, model=self.model, state=state, stage=stage, world_size=self.world,
                       rank=self.rank, grad_accum=self.cfg.train.grad_accum, dp_rank=mesh.dp_rank,
                       dp_size=mesh.dp_size, announce=self._announce,
                       fresh_loader=lambda: build_stage_loader(stage, self.cfg.train.seed, tokenizer,
                                                               dp_rank=mesh.dp_rank, dp_size=mesh.dp_size))

    def _enter_stage(self, index: int, announce: bool = True) -> StageRun:
        """The stage's RoPE / max length, its cp size's mesh and attention, its step setup
        (announce=False: entered again only to redo a validation of it)."""
        stage = self.stages[index]
        model_cfg = self.plan.model_configs[index]
        where = f"stage {index} ({stage.name})" if self.cfg.stages else "model"
        if announce:
            self._announce(rope_line(where, self.plan.origin if index == 0 else self.model.config, model_cfg))
        cp = stage.parallel.cp_size
        mesh = self._mesh(cp)
        self.model.set_context(model_cfg)  # the stage's RoPE and maximum length
        if index > 0:  # the engine was built with stage 0's attention; a resume may enter any stage first
            self.model.set_attention(attention_for(mesh, stage.parallel, self.device))
        ends = tuple(bucket_ends(self.cfg.validation.buckets, stage.seq_len))
        setup = StepSetup(mesh, self.world, self.device, self.cfg.train.grad_accum, stage.data.micro_batch_size,
                          stage.seq_len, self.cfg.train.loss_chunk_size, bucket_ends=ends,
                          loss_buckets=torch.tensor(ends, dtype=torch.long, device=self.device))
        return StageRun(mesh, setup, stage_rates(model_cfg, setup, self.peak))

    def _training_loader(self, stage: RunStage, mesh, tokenizer, loader_state: Optional[dict]):
        """The stage's loader of model inputs, at `loader_state` when resuming inside the stage.
        Unscored row tails are dropped in the stage's trim multiple (config.run_plan.trim_multiple)."""
        collate = ModelInputs(stage.data.document_masking, self.cfg.train.answer_loss_weight,
                              trim_multiple=self.plan.trim_multiple(stage.index))
        self._fingerprints(stage.index)  # the files as the loader opens them (hashes remembered per version)
        loader = build_stage_loader(stage, self.cfg.train.seed, tokenizer, dp_rank=mesh.dp_rank,
                                    dp_size=mesh.dp_size, collate=collate)
        if loader_state is not None:
            loader.load_state_dict(loader_state, restart_sources=self.restart_sources)
        return loader

    def _announce(self, line: str) -> None:
        """A line confirming what the run does: in every rank's log, and on rank 0's console
        (above the progress bar when one is shown)."""
        log.info("%s", line)
        if self.rank == 0:
            if self.outputs is not None:
                self.outputs.progress.write(line)
            else:
                print(line, file=sys.stderr)

    def close(self) -> None:
        """Release out_dir's lock, then the DeepSpeed engine's hooks and buffers (its documented
        cleanup): without it a ZeRO >= 1 engine, its model and its process groups outlive the
        job in this process. Never raises: teardown must not replace the job's result."""
        self.flag.uninstall()
        self.watchdog.stop()
        self._release_lock()
        if self.engine is None:
            return
        try:
            self.engine.destroy()
        except Exception as e:  # noqa: BLE001
            log.warning("DeepSpeed engine cleanup failed: %s", e)
        self.engine = None

    def _release_lock(self) -> None:
        if self.lock is not None:
            run_lock.release_lock(self.out, self.lock)
            self.lock = None

    # ---------------------------------------------------------------------- the steps
    def _run_stage(self, state: TrainState, tokenizer, loader_state: Optional[dict],
                   totals: RunTotals) -> Optional[int]:
        """Steps of the current stage until it ends (state moves to the next stage) or a
        preemption (returns PREEMPTED_EXIT_CODE after saving)."""
        si = state.stage
        stage = self.stages[si]
        run = self._enter_stage(si)
        loader = self._training_loader(stage, run.mesh, tokenizer, loader_state)
        batches = watched_batches(iter(loader), self.watchdog)
        while state.stage_step < stage.steps:
            self.watchdog.beat("data", step=state.step + 1)
            record = self._step(run, batches, stage, state)
            self.watchdog.step_done(record["step_time_s"])
            self._account(record, state, si, stage)
            totals.final_loss = record["loss"]
            stage_done = state.stage_step == stage.steps
            pending = None
            if self.validator.due(state.step, stage_done):  # before checkpoint N: a resume from it goes on
                self.watchdog.beat("validation")  # between steps: the start-up limit, as a checkpoint
                row = self.validator.run(self.engine, run.mesh, self.device, si, state.step, tokenizer,
                                         stop=self.flag.agreed)  # a signal: stops between its forwards
                if row is None:
                    pending = (si, state.step)  # checkpoint N says so: the resumed run redoes it first
                else:
                    self.outputs.writer.write_validation(row)
            preempt = self.flag.agreed()
            due = self.cfg.checkpoint.every > 0 and state.step % self.cfg.checkpoint.every == 0
            if stage_done:
                state.stage += 1
                state.stage_step = 0
            if due or stage_done or preempt:
                with self.watchdog.slow_phase("checkpoint"):
                    self._save(state, loader.state_dict(), data_stage=si, cp=run.mesh.cp_size, pending=pending)
            if preempt:
                self._report_preemption(state.step)
                return PREEMPTED_EXIT_CODE
            if stage_done:
                break
        return None

    def _redo_validation(self, tokenizer) -> Optional[int]:
        """The validation a signal stopped before the checkpoint the run resumes from, run first
        (its row comes before the next step's, as in an uninterrupted run); PREEMPTED_EXIT_CODE
        when a signal stops it again (the checkpoint still holds it as pending)."""
        pending = read_trainer_state(self.resume_from).get("validation_pending")
        if not pending or not self.validator.section.enabled:
            return None
        si, step = pending
        run = self._enter_stage(si, announce=False)
        row = self.validator.run(self.engine, run.mesh, self.device, si, step, tokenizer, stop=self.flag.agreed)
        if row is None:
            self._report_preemption(step)
            return PREEMPTED_EXIT_CODE
        self.outputs.writer.write_validation(row)
        return None

    def _step(self, run: StageRun, batches, stage: RunStage, state: TrainState) -> dict:
        """One optimizer step at the stage's learning rate for this step (train/step.py)."""
        opt = stage.optim
        lr = lr_at(state.stage_step, stage.steps, lr=opt.lr, warmup_steps=opt.warmup_steps, schedule=opt.schedule,
                   min_lr_ratio=opt.min_lr_ratio)
        return step_record(train_step(self.engine, self.model, batches, lr, run.setup), run.setup, run.rates)

    def _account(self, record: dict, state: TrainState, si: int, stage) -> None:
        """Count the step, apply the non-finite policy, advance the progress, log the metrics."""
        state.step += 1
        try:
            record["skipped"] = self.guard.observe(state.step, record["loss"], record["grad_norm"],
                                                   record.pop("update_applied"), self.last_checkpoint)
        except NonFiniteStop:
            self.outputs.writer.write(dict(record, step=state.step, stage=si, skipped=True))
            raise
        state.stage_step += 1
        state.tokens += record["tokens"]
        self.outputs.progress.update(1, **progress_fields(record, si if len(self.stages) > 1 else None))
        if record["skipped"] or state.step % self.cfg.log.every == 0 or state.stage_step == stage.steps:
            record.update(step=state.step, stage=si, tokens_seen=state.tokens, peak_flops_source=self.peak_src)
            self.outputs.writer.write(record)

    def _preempted_in_startup(self) -> bool:
        """Collective, before the first step: True on every rank when any rank was signalled.
        Rank 0 then writes PREEMPTED with the step the next start continues from (0: none), so
        launchers requeue; nothing else was written that the next start would find."""
        if not self.flag.agreed():
            return False
        resumes = self.resume_from or next(iter(self.resume_candidates), None)
        step = int(resumes.name.split("_")[-1]) if resumes is not None else 0  # its name: it may not verify
        name = signal.Signals(self.flag.received).name if self.flag.received else "a signal on another rank"
        after = f"resumes from step {step}" if step else "starts the run"
        log.warning("preemption signal %s during start-up: stopping before the first step, exit %d",
                    name, PREEMPTED_EXIT_CODE)
        if self.rank == 0:
            (self.out / PREEMPTED_MARKER).write_text(f"{step}\n")
            print(f"preempted ({name}) during start-up, before the first step: nothing trained; exit code "
                  f"{PREEMPTED_EXIT_CODE}; the same command {after}", file=sys.stderr, flush=True)
        return True

    def _report_preemption(self, step: int) -> None:
        log.warning("preemption signal %s: checkpoint saved at step %d, exiting with %d",
                    self.flag.received, step, PREEMPTED_EXIT_CODE)
        if self.rank == 0:
            # torchrun reports its own exit code, so launchers can also read this marker
            (self.out / PREEMPTED_MARKER).write_text(f"{step}\n")
            self.outputs.progress.write(f"preempted: saved step {step}, exit code {PREEMPTED_EXIT_CODE}")

    # --------------------------------------------------------------------- checkpoints
    def _write_hf(self, path: Path) -> Optional[str]:
        """Collective: rank 0 writes the HF export; returns the agreed failure, or None."""
        state = full_state_dict(self.engine, self.model)  # collective under ZeRO-3

        def write() -> None:
            if self.rank == 0:
                save_hf_weights(state, self.model.config, path, tokenizer=TokenizerFiles(self.cfg.data.tokenizer))

        return run_phase(write)

    def _fingerprints(self, si: int) -> list:
        """Stage si's data source fingerprints, as taken when its loader was built."""
        if si not in self._source_fingerprints:
            self._source_fingerprints[si] = fingerprint_sources(self.stages[si].data)
        return self._source_fingerprints[si]

    def _save(self, state: TrainState, loader_state: dict, data_stage: int, cp: int,
              pending: Optional[tuple] = None) -> None:
        if not weights_finite(self.model):
            kept = f"last checkpoint: {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint written yet"
            raise NonFiniteStop(f"train: non-finite weights at step {state.step}; not checkpointed ({kept})",
                                state.step)
        trainer_state = TrainerState.of(state, world_size=self.world, cp_size=cp,
                                        stage_steps=[s.steps for s in self.stages], data_stage=data_stage,
                                        data_sources=self._fingerprints(data_stage), model=self.model.config,
                                        dtype=self.dtype, tokenizer=self.cfg.data.tokenizer)
        rank_state = {"data": loader_state, "rng": rng_state()}
        recorded = dict(trainer_state.state_dict(), validation_sources=self.validator.fingerprints(data_stage),
                        validation_pending=list(pending) if pending else None)
        self.last_checkpoint = save_checkpoint(
            self.out, state.step, engine=self.engine, trainer_state=recorded, rank_state=rank_state,
            keep_last=self.cfg.checkpoint.keep_last, hf_writer=self._write_hf if self.cfg.checkpoint.save_hf else None)


def train(cfg: TrainConfig, plan: Optional[RunPlan] = None) -> int:
    """Run the job of `cfg`; `plan`: validate_config's for it (validated here when not given)."""
    trainer = Trainer(cfg, plan)
    completed = False
    try:
        try:
            rc = trainer.run()
        except NonFiniteStop as e:
            rc = report_stop(e, trainer.rank, trainer.out)
        except RuntimeError as e:
            if is_collective_timeout(e):  # a peer stalled: say which, then end like a lost node
                trainer.watchdog.collective_failed(e)
            raise
        except UserError as e:  # checkpoint or data identity: every rank raises it; the CLI prints rank 0's
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
