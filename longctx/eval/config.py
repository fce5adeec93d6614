"""`longctx eval`'s configuration: one typed schema, loaded like the training config.

    cfg = load_structured(EvalConfig, "eval.yaml", ["samples=5"], prefix="eval.")
    cfg.validate(world_size)          # every check that needs no weights or process group
    selection = select(cfg)           # lengths, tasks, needle-depth grids, perplexity lengths

Fields are named `eval.<field>` in messages; every field is also a command-line flag
(`--max-batch-tokens` for max_batch_tokens). Lists may be written as "4k,8k".
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List
from urllib.parse import urlparse

from longctx.base.errors import UserError
from longctx.config import check_out_dir
from longctx.data.tokenizer import check_tokenizer_spec
from longctx.eval.dtypes import check_dtype_name
from longctx.eval.endpoint.masking import mask_userinfo
from longctx.eval.fields import TOKENIZER_FIELD, EvalFields
from longctx.eval.lengths import parse_lengths
from longctx.eval.model_overrides import check_keys
from longctx.eval.tasks import NIAH_GRID_TASK, RULER_TASKS, TaskOptions, get_task
from longctx.parallel.layout import DECODE_CP_IMPLS
from longctx.parallel.timeout_values import timeout_problem
from longctx.reporting.wandb_log import check_installed, check_mode

SUITES = ("ruler", "niah", "passkey", "ppl", "none")  # none: only --lm-eval / --mrcr
DEFAULT_DEPTHS = [i / 10 for i in range(11)]
DEFAULT_LENGTHS = ["4096"]  # eval.lengths unset (with ruler_data: the data's lengths instead)
DEVICES = ("auto", "cpu", "cuda")
MODES = ("generate", "teacher_forced")
ENDPOINT_MODES = ("completions", "chat")  # eval/endpoint/backend.py
PATH_FIELDS = ("essay", "squad", "hotpotqa", "ppl_data", "ruler_data", "words")  # must exist


@dataclass
class EvalConfig(EvalFields):
    """`longctx eval`'s configuration: the fields of eval/fields.py and their checks."""

    def validate(self, world_size: int) -> None:
        """Every check that needs no weights or process group, for `world_size` processes."""
        if self.endpoint is not None:
            check_endpoint(self, world_size)
        elif not self.model and self.write_data is None:
            raise UserError("eval.model: required (--model DIR: an HF directory, checkpoint or run directory, or a "
                            "Hub id org/name; or --endpoint URL for a served model)")
        if not self.model and self.tokenizer is None:
            raise UserError("eval.tokenizer: write_data without a model needs the tokenizer that fits the lengths "
                            "(--tokenizer byte, a tokenizer.json or a tokenizer directory)")
        for name, minimum in (("samples", 1), ("seed", 0), ("max_batch_tokens", 1), ("ppl_windows", 1)):
            _at_least(name, getattr(self, name), minimum)
        if self.batch_size is not None:
            _at_least("batch_size", self.batch_size, 1)
        for name in ("timeout_s", "startup_timeout_s"):
            if problem := timeout_problem(getattr(self, name)):
                raise UserError(f"eval.{name}: {problem}")
        if not (math.isfinite(self.threshold) and 0 <= self.threshold <= 100):
            raise UserError(f"eval.threshold: must be a finite number in [0, 100], got {self.threshold}")
        select(self)
        check_dtype_name(self.dtype)
        _check_device(self.device, self.cp)
        if self.cp_impl not in DECODE_CP_IMPLS:
            raise UserError(f"eval.cp_impl: {self.cp_impl!r} is not valid; valid: {', '.join(DECODE_CP_IMPLS)}")
        _check_cp(self.cp, world_size)
        _check_mode(self.mode, self.cp)
        for name in PATH_FIELDS:
            if getattr(self, name) is not None and not Path(getattr(self, name)).exists():
                raise UserError(f"eval.{name}: {getattr(self, name)} does not exist")
        for name in ("out", "write_data"):
            if getattr(self, name) is not None:
                check_out_dir(getattr(self, name), f"eval.{name}")
        if self.tokenizer is not None:
            check_tokenizer_spec(self.tokenizer, TOKENIZER_FIELD)
        check_keys(self.model_overrides)
        self._check_lm_eval(world_size)
        if self.wandb_project is not None:
            check_mode("eval.wandb_mode", self.wandb_mode)
            if self.out is None:
                raise UserError("eval.wandb_project: W&B writes its files in --out; set --out")
            check_installed("eval.wandb_project")

    def _check_lm_eval(self, world_size: int) -> None:
        """--lm-eval's tasks and options (lm-eval installed, every task known), and that something runs."""
        sel = select(self)
        self._check_mrcr()
        if not (math.isfinite(self.gate_threshold) and self.gate_threshold >= 0):
            raise UserError(f"eval.gate_threshold: must be a finite number >= 0 (points), got {self.gate_threshold}")
        if self.compare is not None:
            from longctx.eval.gate import load_base

            load_base(self.compare)
        elif self.gate_tasks is not None:
            raise UserError("eval.gate_tasks: needs --compare BASE_RESULTS (the base model's results.json)")
        if self.lm_eval is None:
            if not (sel.tasks or sel.ppl_lengths or self.mrcr) and self.write_data is None:
                raise UserError("eval.suite: none, and no --lm-eval tasks or --mrcr: nothing to evaluate")
            return
        from longctx.eval.harness import options as harness  # lm-eval's task index, no torch

        harness.check_installed()
        if not self.lm_eval:
            raise UserError("eval.lm_eval: name at least one lm-eval task (e.g. --lm-eval hellaswag)")
        if self.endpoint is not None and self.api_key_env != "OPENAI_API_KEY":
            raise UserError(f"eval.api_key_env: lm-eval's served models read the key from OPENAI_API_KEY only; got "
                            f"{self.api_key_env}")
        if self.endpoint is None and world_size != self.cp:
            raise UserError(f"eval.lm_eval: lm-eval's tasks run on one group of eval.cp processes; got {world_size} "
                            f"processes for eval.cp={self.cp} (run them with --nproc-per-node {self.cp})")
        harness.check_tasks(list(self.lm_eval), harness.parse_args(self.lm_eval_args))

    def _check_mrcr(self) -> None:
        if self.mrcr_samples is not None:
            _at_least("mrcr_samples", self.mrcr_samples, 1)
        if self.mrcr is None:
            return
        hub_id = self.mrcr.count("/") == 1 and not self.mrcr.startswith((".", "/", "~"))
        if not Path(self.mrcr).expanduser().exists() and not hub_id:
            raise UserError(f"eval.mrcr: {self.mrcr} does not exist (a file or folder in MRCR's columns, or a Hub id "
                            "such as openai/mrcr)")
        if self.endpoint is not None and self.endpoint_mode != "chat":
            raise UserError("eval.endpoint_mode: MRCR sends its conversations as messages: --endpoint-mode chat")

    def task_options(self) -> TaskOptions:
        return TaskOptions(style=self.style, max_new_tokens=self.max_new_tokens, essay_path=self.essay,
                           squad_path=self.squad, hotpotqa_path=self.hotpotqa,
                           chat_template=None if self.chat_template == "auto" else self.chat_template,
                           num_digits=self.num_digits, words_path=self.words)


@dataclass
class EvalSelection:
    """What an EvalConfig asks to run, parsed."""

    lengths: List[int]
    tasks: List[str]
    grids: Dict[str, List[float]]  # task -> needle depths of its depth x length grid
    ppl_lengths: List[int]  # empty: no perplexity
    options: TaskOptions


def select(cfg: EvalConfig) -> EvalSelection:
    """The tasks, grids and lengths of `cfg` (UserError naming the field for a bad one)."""
    for s in cfg.suite:
        if s not in SUITES:
            raise UserError(f"eval.suite: unknown suite {s!r}; valid: {', '.join(SUITES)}")
    depths = [_number(d, "eval.depths") for d in cfg.depths] if cfg.depths is not None else DEFAULT_DEPTHS
    for d in depths:
        if not 0.0 <= d <= 1.0:
            raise UserError(f"eval.depths: {d} is outside [0, 1]")
    tasks, grids = [], {}
    if cfg.tasks is not None:
        tasks = list(cfg.tasks)
        for t in tasks:
            get_task(t)  # unknown task -> UserError
        if cfg.depths is not None:
            grids = {t: depths for t in tasks if get_task(t).family in ("niah", "passkey")}
    else:
        for s in cfg.suite:
            if s == "ruler":
                tasks += RULER_TASKS
            elif s in ("niah", "passkey"):
                name = NIAH_GRID_TASK if s == "niah" else "passkey"
                tasks.append(name)
                grids[name] = depths
    want_ppl = "ppl" in cfg.suite
    lengths = parse_lengths(cfg.lengths if cfg.lengths is not None else DEFAULT_LENGTHS)
    if not tasks and not want_ppl and cfg.lengths is None:
        lengths = []  # suite none: no haystack lengths (nothing to warn about)
    ppl_lengths = ((parse_lengths(cfg.ppl_lengths, "eval.ppl_lengths") if cfg.ppl_lengths else lengths)
                   if want_ppl else [])
    return EvalSelection(lengths, list(dict.fromkeys(tasks)), grids, ppl_lengths, cfg.task_options())


def _check_cp(cp: int, world: int) -> None:
    """eval.cp against the processes this eval runs in, before any process group."""
    if cp < 1:
        raise UserError(f"eval.cp: must be >= 1, got {cp}")
    if world == 1 and cp > 1:
        raise UserError(f"eval.cp={cp} needs {cp} processes: torchrun --nproc-per-node {cp} -m longctx eval ...")
    if world % cp != 0:
        raise UserError(f"eval.cp={cp} must divide the number of processes ({world})")


def _check_mode(mode: str, cp: int) -> None:
    if mode not in MODES:
        raise UserError(f"eval.mode: {mode!r} is not valid; valid: {', '.join(MODES)}")
    if mode == "teacher_forced" and cp > 1:
        raise UserError(f"eval.mode: teacher_forced runs each sample on one process (eval.cp=1), got eval.cp={cp}; "
                        "processes split the samples (data parallel), or use mode=generate for cp prefill")


def check_endpoint(cfg: EvalConfig, world_size: int) -> None:
    """What a served model's evaluation (--endpoint) takes and refuses, before anything runs."""
    try:
        url = urlparse(cfg.endpoint)
        url.port  # noqa: B018 - a port that is not a number in 0-65535 raises here
    except ValueError as e:
        raise UserError(f"eval.endpoint: {mask_userinfo(cfg.endpoint)!r} is not a valid URL ({e}); give the "
                        "server's OpenAI API root, e.g. http://localhost:8000/v1") from None
    if url.scheme not in ("http", "https") or not url.netloc:
        raise UserError(f"eval.endpoint: {mask_userinfo(cfg.endpoint)!r} is not an http(s) URL; give the server's "
                        "OpenAI API root, e.g. http://localhost:8000/v1")
    if cfg.model:
        raise UserError("eval.model: --endpoint evaluates the served model; leave --model out (compare with a "
                        "checkpoint by a second eval with --model into another --out)")
    if cfg.tokenizer is None:
        raise UserError("eval.tokenizer: required with --endpoint: the served model's tokenizer (a directory, a "
                        "tokenizer.json or a Hub id), which sizes the haystacks")
    if cfg.endpoint_mode not in ENDPOINT_MODES:
        raise UserError(f"eval.endpoint_mode: {cfg.endpoint_mode!r} is not valid; valid: {', '.join(ENDPOINT_MODES)}")
    if cfg.endpoint_mode == "chat" and cfg.chat_template is not None:
        raise UserError("eval.chat_template: endpoint_mode chat sends messages, which the server wraps in its own "
                        "template; leave chat_template out, or use endpoint_mode completions")
    _at_least("concurrency", cfg.concurrency, 1)
    _at_least("retries", cfg.retries, 0)
    if problem := timeout_problem(cfg.request_timeout_s):
        raise UserError(f"eval.request_timeout_s: {problem}")
    if not cfg.api_key_env or not cfg.api_key_env.replace("_", "a").isalnum():
        raise UserError(f"eval.api_key_env: {cfg.api_key_env!r} is not an environment variable's name")
    refused = [("suite", "ppl" in cfg.suite or bool(cfg.ppl_lengths), "ppl scores the model's own log-likelihoods: "
                "evaluate it in process (--model)"),
               ("mode", cfg.mode != "generate", "teacher_forced needs the model's logits: evaluate it in process"),
               ("cp", cfg.cp != 1 or world_size > 1, "one process sends the requests (raise --concurrency); run "
                "it without torchrun"),
               ("dtype", cfg.dtype != "auto", "the server's choice (vllm serve --dtype ...)"),
               ("model_overrides", bool(cfg.model_overrides), "the server's choice (vllm serve --hf-overrides ...)"),
               ("write_data", cfg.write_data is not None, "writes prompts without a model: leave --endpoint out")]
    for name, bad, why in refused:
        if bad:
            raise UserError(f"eval.{name}: not with --endpoint: {why}")


def _at_least(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise UserError(f"eval.{name}: must be >= {minimum}, got {value}")


def _number(value: str, field: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise UserError(f"{field}: must be a number, got {value!r}") from None
    if not math.isfinite(number):
        raise UserError(f"{field}: must be a finite number, got {value!r}")
    return number


def _check_device(device: str, cp: int) -> None:
    if device not in DEVICES:
        raise UserError(f"eval.device: {device!r} is not valid; valid: {', '.join(DEVICES)}")
    if device == "auto":
        return
    import torch  # the device probe: config checks load no torch otherwise (tests/integration/test_cli.py)

    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("eval.device: cuda, but this process sees no CUDA device; valid here: auto, cpu")
    if device == "cpu" and cp > 1 and torch.cuda.is_available():
        raise UserError(f"eval.device: cpu with eval.cp={cp} on a machine with CUDA: the ranks talk over NCCL, "
                        "which needs GPU tensors; valid: auto, cuda")
