"""The training job, top to bottom: build (model, parallelize, engine) -> per stage (enter it,
its loader, its steps) -> checkpoints -> the HF export. The step itself is train/step.py; where
the run reports (log lines, metrics, progress, the end summary) train/reporting.py; what its
checkpoints record train/saving.py, and how a run resumes from one longctx/checkpoint/ (resume.py)."""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from longctx.checkpoint.adapter_record import base_hash, check_adapter_config, check_base
from longctx.checkpoint.manifest import gather_objects
from longctx.checkpoint.resume import (
    RankPlace,
    RestoreTarget,
    ResumePoint,
    choose_resume,
    restore,
    resume_candidates,
    resume_point,
)
from longctx.checkpoint.state import TrainState
from longctx.checkpoint.store import CheckpointError, read_trainer_state
from longctx.config import RunPlan, RunStage, TrainConfig
from longctx.config.probe import original_context
from longctx.config.validation import bucket_ends
from longctx.data import check_vocab, load_tokenizer
from longctx.data.loader import ModelInputs
from longctx.parallel.activation_offload import offload_for
from longctx.parallel.mesh import build_mesh, init_distributed
from longctx.parallel.parallelize import attention_for, parallel_engine
from longctx.runtime.host_memory import HostMemoryGuard
from longctx.runtime.launch_env import read_env
from longctx.runtime.watchdog import Watchdog, watched_batches
from longctx.train import run_lock
from longctx.train.build import (
    build_plain_model,
    deepspeed_config_for,
    optimizer_for,
    plan_for,
    setup_logging,
    train_dtype,
)
from longctx.train.metrics import progress_fields
from longctx.train.mfu import peak_flops_per_device
from longctx.train.nonfinite import NonFiniteGuard, NonFiniteStop
from longctx.train.reporting import Reporter
from longctx.train.run_files import changed_resumed_sources, take_run_lock, write_run_files
from longctx.train.saving import RunCheckpoints
from longctx.train.schedule import lr_at
from longctx.train.signals import PREEMPTED_EXIT_CODE, PreemptionFlag, stopped_after_save, stopped_in_startup
from longctx.train.stages import build_stage_loader, check_sources
from longctx.train.step import StepSetup, train_step
from longctx.train.step_metrics import StepRates, stage_rates, step_record
from longctx.train.summary import RunTotals, layout_line, rope_line
from longctx.train.validation import Validator, check_resumed_heldout

log = logging.getLogger("longctx.train")


@dataclasses.dataclass(frozen=True)
class StageRun:
    """What the steps of one stage run with: its mesh, step setup and metric rates."""
    mesh: object  # parallel.mesh.Mesh
    setup: StepSetup
    rates: StepRates


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
        self.report = Reporter(self.out, self.rank, cfg)
        self.watchdog = Watchdog(rank=self.rank, world=self.world, timeout_s=cfg.parallel.timeout_s,
                                 startup_timeout_s=cfg.parallel.startup_timeout_s,
                                 log_path=self.out / "logs" / f"rank_{self.rank:05d}.log", marker_dir=self.out,
                                 on_end=self._release_lock).start()
        self.dtype = train_dtype(cfg)
        self.device = (torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available()
                       else torch.device("cpu"))
        self._meshes: dict[int, object] = {}
        self.guard = NonFiniteGuard(cfg.train.nonfinite, cfg.train.max_nonfinite_steps)
        self.host_memory = HostMemoryGuard()  # flat host memory over a long run (runtime/host_memory.py)
        self.resume_from: Optional[Path] = None
        self.restart_sources: set = set()
        self.checkpoints = RunCheckpoints(self.out, cfg.checkpoint, self.stages, self.validator,
                                          tokenizer=cfg.data.tokenizer, world=self.world, rank=self.rank,
                                          dtype=self.dtype, adapter=cfg.train.adapter, base=cfg.model.init_from,
                                          seed=cfg.train.seed)
        self.pending_validation: Optional[tuple] = None  # (stage, step) a signal stopped before the checkpoint
        self.peak, self.peak_src = peak_flops_per_device(cfg.log.peak_tflops, self.dtype)  # a table, or a cache
        # built by run(): the engine and its model (_build_engine); the reporter's outputs open after them
        self.engine = self.model = None
        self.offload = None  # parallel.offload_activations' store (parallel/activation_offload.py)

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
        self.resume_from = self.checkpoints.last = choose_resume(self.resume_candidates, cfg.checkpoint.resume)
        self.restart_sources = changed_resumed_sources(self.resume_from, self.stages)
        check_resumed_heldout(self.resume_from, self.stages, self.validator, cfg.data.allow_changed_sources)
        if self._preempted_in_startup():  # ... during the checkpoint's verification
            return PREEMPTED_EXIT_CODE
        write_run_files(self.out, self.rank, cfg)
        point = resume_point(self.resume_from, self.stages, model_config=self.plan.model_configs[0],
                             world_size=self.world, grad_accum=cfg.train.grad_accum, rank=self.rank)
        if point is not None and point.finished:
            return 0  # nothing left to train (the notice is printed)
        if point is not None:  # the same adapter configuration (or none), before any work
            check_adapter_config(point.checkpoint, point.saved, cfg.train.adapter)
        torch.manual_seed(cfg.train.seed)
        tokenizer = self._build_engine()
        if point is not None and cfg.train.adapter is not None:  # the base the adapter was trained on
            check_base(point.checkpoint, point.saved, self.checkpoints.base_sha256)
        if self._preempted_in_startup():  # ... while the model and the engine were built
            return PREEMPTED_EXIT_CODE
        state = TrainState()
        loader_state = self._restore(point, state, tokenizer) if point is not None else None
        if self._preempted_in_startup():  # ... while the checkpoint loaded (from here: the step loop's check)
            return PREEMPTED_EXIT_CODE
        totals = RunTotals(first_step=state.step, first_tokens=state.tokens)
        self.report.open(state.step, sum(s.steps for s in self.stages), self.dtype, self.device)
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
                    problem = self.checkpoints.write_hf(self.engine, self.model, self.out / "hf")
                if problem:
                    raise CheckpointError(f"checkpoint.export_hf: cannot write {self.out / 'hf'}: {problem}")
                totals.export = self.out / "hf"
        finally:
            self.report.close()
        self.report.plot_validation()
        totals.step, totals.tokens, totals.last_checkpoint = state.step, state.tokens, self.checkpoints.last
        totals.wall_seconds = time.monotonic() - self.start_time
        self.report.print_summary(totals, stages=len(self.stages), preempted=rc == PREEMPTED_EXIT_CODE)
        return rc

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
        if cfg.train.adapter is not None:  # rank 0 hashes the frozen base once, every rank knows it
            self.checkpoints.base_sha256 = gather_objects(base_hash(model) if self.rank == 0 else None)[0]
        folder = Path(par.offload_activations_path) if par.offload_activations_path else self.out / "offload"
        self.offload = offload_for(par.offload_activations, self.device, folder, self.rank)
        self.engine = parallel_engine(model, self._mesh(par.cp_size), par, device=self.device,
                                      optimizer=optimizer_for(model, cfg.optim, par.offload_optimizer),
                                      ds_config=deepspeed_config_for(cfg, self.world, self.plan.deepspeed),
                                      offload=self.offload)
        self.model = model
        self._announce(layout_line(self.world, self.world // par.cp_size, par.cp_size, par.cp_impl, par.zero_stage,
                                   par.offload_optimizer, cfg.train.dtype, par.activation_checkpointing))
        if self.offload is not None:
            where = "host buffers" if par.offload_activations == "host" else f"a per-rank file in {folder}"
            self._announce(f"activation offload: the checkpointed blocks' inputs wait for the backward in {where}")
        return tokenizer

    def _restore(self, point: ResumePoint, state: TrainState, tokenizer) -> Optional[dict]:
        """The checkpoint into the engine and `state` (checkpoint/resume.py); the loader state
        when it belongs to the stage the run continues with."""
        stage = self.stages[point.continuation.stage]
        mesh = self._mesh(stage.parallel.cp_size)
        return restore(point, RestoreTarget(self.engine, self.model, state), stage=stage,
                       place=RankPlace(self.rank, self.world, mesh.dp_rank, mesh.dp_size),
                       grad_accum=self.cfg.train.grad_accum, announce=self._announce,
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
        # its kernels and communicators are new: the start-up limits until its first steps ran
        self.watchdog.new_shape((stage.seq_len, cp, stage.data.micro_batch_size))
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
        self.checkpoints.fingerprints(stage.index)  # the files as the loader opens them (hashes remembered per version)
        loader = build_stage_loader(stage, self.cfg.train.seed, tokenizer, dp_rank=mesh.dp_rank,
                                    dp_size=mesh.dp_size, collate=collate)
        if loader_state is not None:
            loader.load_state_dict(loader_state, restart_sources=self.restart_sources)
        return loader

    def _announce(self, line: str) -> None:
        self.report.announce(line)

    def close(self) -> None:
        """Release out_dir's lock, then the DeepSpeed engine's hooks and buffers (its documented
        cleanup): without it a ZeRO >= 1 engine, its model and its process groups outlive the
        job in this process. Never raises: teardown must not replace the job's result."""
        self.flag.uninstall()
        self.watchdog.stop()
        self._release_lock()
        if getattr(self, "offload", None) is not None:
            self.offload.close()
            self.offload = None
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
            self.host_memory.after_step()
            self._account(record, state, si, stage)
            totals.final_loss = record["loss"]
            stage_done = state.stage_step == stage.steps
            pending = None
            if self.validator.due(state.step, stage_done):  # before checkpoint N: a resume from it goes on
                self.watchdog.beat("validation")  # between steps: the start-up limit, as a checkpoint
                row = self.validator.run(self.engine, run.mesh, self.device, si, state.step, tokenizer,
                                         stop=self.flag.agreed,  # a signal: stops between its forwards
                                         slow_phase=self.watchdog.slow_phase)  # the rows, built once
                if row is None:
                    pending = (si, state.step)  # checkpoint N says so: the resumed run redoes it first
                else:
                    self.report.outputs.writer.write_validation(row)
            preempt = self.flag.agreed()
            due = self.cfg.checkpoint.every > 0 and state.step % self.cfg.checkpoint.every == 0
            if stage_done:
                state.stage += 1
                state.stage_step = 0
            if due or stage_done or preempt:
                with self.watchdog.slow_phase("checkpoint"):
                    self.checkpoints.save(self.engine, self.model, state, loader.state_dict(), data_stage=si,
                                          cp=run.mesh.cp_size, pending=pending)
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
        row = self.validator.run(self.engine, run.mesh, self.device, si, step, tokenizer, stop=self.flag.agreed,
                                 slow_phase=self.watchdog.slow_phase)
        if row is None:
            self._report_preemption(step)
            return PREEMPTED_EXIT_CODE
        self.report.outputs.writer.write_validation(row)
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
                                                   record.pop("update_applied"), self.checkpoints.last)
        except NonFiniteStop:
            self.report.outputs.writer.write(dict(record, step=state.step, stage=si, skipped=True))
            raise
        state.stage_step += 1
        state.tokens += record["tokens"]
        outputs = self.report.outputs
        outputs.progress.update(1, **progress_fields(record, si if len(self.stages) > 1 else None))
        if record["skipped"] or state.step % self.cfg.log.every == 0 or state.stage_step == stage.steps:
            record.update(step=state.step, stage=si, tokens_seen=state.tokens, peak_flops_source=self.peak_src)
            outputs.writer.write(record)

    def _preempted_in_startup(self) -> bool:
        """Collective, before the first step: True on every rank when any rank was signalled
        (rank 0 then writes PREEMPTED: signals.stopped_in_startup)."""
        if not self.flag.agreed():
            return False
        stopped_in_startup(self.flag, self.rank, self.out, self.resume_from or next(iter(self.resume_candidates), None))
        return True

    def _report_preemption(self, step: int) -> None:
        stopped_after_save(self.flag, self.rank, self.out, step, self.report.outputs.progress)

