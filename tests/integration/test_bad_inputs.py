"""Every bad input is caught before any work (issue 21): exit code 2, exactly one stderr line
`error: <field or file>: ...` that names the field or file, no traceback, and nothing written or
deleted in the working directory (a recursive listing with sizes and mtimes, before and after).

One case is one tuple, `(id, argv, needle)`: argv is a `longctx` command line (or a launcher's),
"{w}" in it is the working directory, needle a substring the error line must hold. Append new
cases to the table they belong to. Most run in-process through longctx.commands.cli.main; a few run as
real subprocesses (`python -m longctx`, the shell launchers) to prove exit code and output end
to end; those start together and are awaited together.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.attention.flash import flash_available
from longctx.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]
RUN = "out_dir={w}/run"  # every train case points its run directory into the working dir
LONGROPE = "[1, 1, 1, 1, 1, 1, 1, 1]"  # debug-tiny: head_dim 16 -> 8 factors

TRAIN = [
    ("max_position_embeddings below the training length", ["train", RUN, "data.seq_len=512",
                                                            "model.max_position_embeddings=300"],
     "model.max_position_embeddings: the model's max_position_embeddings 300 is below the training length"),
    ("resume from a checkpoint without COMPLETE", ["train", RUN, "checkpoint.resume={w}/incomplete/step_0000002"],
     "not a complete checkpoint (no COMPLETE marker)"),
    ("resume from a checkpoint without manifest", ["train", RUN, "checkpoint.resume={w}/unlisted/step_0000003"],
     "checkpoint.resume: {w}/unlisted/step_0000003: no MANIFEST.json"),
    # config loading
    ("unknown key", ["train", RUN, "train.stpes=3"], "did you mean 'train.steps'"),
    ("wrong type", ["train", RUN, "train.steps=many"], "train.steps"),
    ("yaml flow error in a mapping", ["train", RUN, "model.rope_parameters={rope_type: yarn"],
     "model.rope_parameters: cannot parse"),
    ("yaml flow error in a list", ["train", RUN, "data.sources=["], "data.sources: cannot parse"),
    ("override without a key", ["train", RUN, "=3"], "not a dotted key"),
    ("override with an empty key part", ["train", RUN, "train..steps=3"], "'train..steps' is not a dotted key"),
    ("override without =", ["train", RUN, "trainsteps"], "expected key=value"),
    ("scalar for a section", ["train", RUN, "train=3"], "train: must be a mapping"),
    ("empty --config", ["train", "--config", "{w}/empty.yaml", RUN], "empty.yaml: empty config file"),
    ("comment-only --config", ["train", "--config", "{w}/comments.yaml", RUN], "comments.yaml: empty config file"),
    ("list --config", ["train", "--config", "{w}/list.yaml", RUN], "list.yaml: expected a mapping"),
    ("invalid YAML --config", ["train", "--config", "{w}/bad.yaml", RUN], "bad.yaml: invalid YAML"),
    ("missing --config", ["train", "--config", "{w}/nope.yaml", RUN], "--config: {w}/nope.yaml does not exist"),
    ("directory --config", ["train", "--config", "{w}/data", RUN], "is a directory"),
    ("scalar section in --config", ["train", "--config", "{w}/scalar_section.yaml", RUN], "optim: must be a mapping"),
    # optimizer
    ("beta1 above 1", ["train", RUN, "optim.beta1=1.5"], "optim.beta1: must be in [0, 1), got 1.5"),
    ("beta1 negative", ["train", RUN, "optim.beta1=-0.1"], "optim.beta1"),
    ("beta2 = 1", ["train", RUN, "optim.beta2=1"], "optim.beta2"),
    ("eps 0", ["train", RUN, "optim.eps=0"], "optim.eps: must be a finite number > 0"),
    ("lr 0", ["train", RUN, "optim.lr=0"], "optim.lr"),
    ("lr nan", ["train", RUN, "optim.lr=nan"], "optim.lr"),
    ("lr inf", ["train", RUN, "optim.lr=inf"], "optim.lr"),
    ("min_lr_ratio above 1", ["train", RUN, "optim.min_lr_ratio=2"], "optim.min_lr_ratio"),
    ("negative weight decay", ["train", RUN, "optim.weight_decay=-1"], "optim.weight_decay"),
    ("negative grad clip", ["train", RUN, "optim.grad_clip=-1"], "optim.grad_clip"),
    ("negative warmup", ["train", RUN, "optim.warmup_steps=-1"], "optim.warmup_steps"),
    ("unknown schedule", ["train", RUN, "optim.schedule=cosin"], "optim.schedule"),
    # parallel
    ("unknown attention backend", ["train", RUN, "parallel.attention_backend=flsh"],
     "parallel.attention_backend: unknown 'flsh'; did you mean 'flash'"),
    ("missing DeepSpeed JSON", ["train", RUN, "parallel.deepspeed_config={w}/nope.json"],
     "parallel.deepspeed_config: {w}/nope.json does not exist"),
    ("corrupt DeepSpeed JSON", ["train", RUN, "parallel.deepspeed_config={w}/corrupt_ds.json"],
     "corrupt_ds.json is not valid JSON"),
    ("DeepSpeed JSON not an object", ["train", RUN, "parallel.deepspeed_config={w}/list_ds.json"],
     "must hold a JSON object"),
    ("DeepSpeed JSON stage mismatch", ["train", RUN, f"parallel.deepspeed_config={ROOT}/launch/deepspeed/zero3.json"],
     "sets ZeRO stage 3 but parallel.zero_stage is 0"),
    ("zero stage 4", ["train", RUN, "parallel.zero_stage=4"], "parallel.zero_stage"),
    ("unknown cp_impl", ["train", RUN, "parallel.cp_impl=ringg"], "parallel.cp_impl"),
    ("unknown checkpointing", ["train", RUN, "parallel.activation_checkpointing=some"],
     "parallel.activation_checkpointing"),
    ("unknown compile mode", ["train", RUN, "parallel.compile=all"], "parallel.compile"),
    ("offload_params without ZeRO-3", ["train", RUN, "parallel.offload_params=true"], "parallel.offload_params"),
    ("ulysses_size 0", ["train", RUN, "parallel.ulysses_size=0"], "parallel.ulysses_size"),
    ("timeout 0", ["train", RUN, "parallel.timeout_s=0"],
     "parallel.timeout_s: must be a finite number of seconds > 0, got 0.0"),
    ("negative start-up timeout", ["train", RUN, "parallel.startup_timeout_s=-5"],
     "parallel.startup_timeout_s: must be a finite number of seconds > 0, got -5.0"),
    ("non-numeric timeout", ["train", RUN, "parallel.timeout_s=soon"], "parallel.timeout_s: must be a number"),
    ("cp not dividing the world", ["train", RUN, "parallel.cp_size=3", "data.seq_len=252"],
     "parallel.cp_size: 3 must divide the world size 1"),
    # data
    ("empty jsonl", ["train", RUN, "data.sources=[{path: '{w}/data/empty.jsonl'}]"],
     "data.sources[0].path: {w}/data/empty.jsonl is empty"),
    ("malformed jsonl", ["train", RUN, "data.sources=[{path: '{w}/data/malformed.jsonl'}]"],
     "malformed.jsonl: the first record is not valid JSON"),
    ("jsonl without the text field", ["train", RUN, "data.sources=[{path: '{w}/data/content.jsonl'}]"],
     "data.sources[0].text_field: 'text' is not a column"),
    ("jsonl of lists", ["train", RUN, "data.sources=[{path: '{w}/data/lists.jsonl'}]"],
     "lists.jsonl: the first record is a list"),
    ("missing data file", ["train", RUN, "data.sources=[{path: '{w}/data/nope.jsonl'}]"],
     "data.sources[0].path: {w}/data/nope.jsonl does not exist"),
    ("glob matching nothing", ["train", RUN, "data.sources=[{path: '{w}/data/*.arrow'}]"],
     "data.sources[0].path: no file matches"),
    ("corrupt parquet", ["train", RUN, "data.sources=[{path: '{w}/data/corrupt.parquet'}]"],
     "corrupt.parquet is not a readable parquet file"),
    ("csv without the text column", ["train", RUN, "data.sources=[{path: '{w}/data/table.csv'}]"],
     "data.sources[0].text_field"),
    ("unknown file format", ["train", RUN, "data.sources=[{path: '{w}/data/table.xyz'}]"], "cannot infer the format"),
    ("second source bad", ["train", RUN, "data.sources=[{kind: synthetic}, {path: '{w}/data/empty.jsonl'}]"],
     "data.sources[1].path"),
    ("missing tokenizer", ["train", RUN, "data.tokenizer={w}/nope-tokenizer.json"], "data.tokenizer"),
    ("a non-UTF-8 row after the first", ["train", RUN, "data.sources=[{path: '{w}/data/nonutf8.jsonl'}]"],
     "data.sources[0]: {w}/data/nonutf8.jsonl row 151: not UTF-8 (byte 0xe9"),
    ("the text field holding an int after the first row", ["train", RUN, "data.sources=[{path: '{w}/data/int.jsonl'}]"],
     "data.sources[0].text_field: {w}/data/int.jsonl row 151: 'text' holds int, not text"),
    ("broken JSON after the first row", ["train", RUN, "data.sources=[{path: '{w}/data/broken.jsonl'}]"],
     "data.sources[0]: {w}/data/broken.jsonl row 151: not valid JSON"),
    ("a truncated .jsonl.gz", ["train", RUN, "data.sources=[{path: '{w}/data/trunc.jsonl.gz'}]"],
     "data.sources[0]: {w}/data/trunc.jsonl.gz: cannot be read"),
    ("a tokenizer directory with only its config", ["train", RUN, "data.tokenizer={w}/tokenizer-config-only"],
     "data.tokenizer: {w}/tokenizer-config-only has no tokenizer.json or other vocabulary file"),
    ("corrupt tokenizer", ["train", RUN, "data.tokenizer={w}/bad.yaml"], "data.tokenizer: cannot read"),
    ("seq_len 1", ["train", RUN, "data.seq_len=1"], "data.seq_len"),
    ("micro batch 0", ["train", RUN, "data.micro_batch_size=0"], "data.micro_batch_size"),
    ("unknown packing", ["train", RUN, "data.packing=tight"], "data.packing"),
    ("unknown source kind", ["train", RUN, "data.sources=[{kind: sql}]"], "data.sources[0].kind"),
    ("negative source weight", ["train", RUN, "data.sources=[{kind: synthetic, weight: -1}]"],
     "data.sources[0].weight"),
    ("unknown synthetic task", ["train", RUN, "data.sources=[{kind: synthetic, synthetic: {tasks: {needle: 1}}}]"],
     "data.sources[0].synthetic.tasks"),
    ("negative data seed", ["train", RUN, "data.seed=-2"], "data.seed"),
    ("negative prefetch", ["train", RUN, "data.prefetch=-1"], "data.prefetch"),
    ("cache wait 0", ["train", RUN, "data.cache_wait_s=0"], "data.cache_wait_s"),
    ("cache dir not writable", ["train", RUN, "data.cache_dir=/proc/longctx-cache"],
     "data.cache_dir: /proc/longctx-cache is not writable"),
    ("hf cache dir is a file", ["train", RUN, "data.hf_cache_dir={w}/empty.yaml"], "data.hf_cache_dir"),
    # model and RoPE
    ("unknown preset", ["train", RUN, "model.preset=llama9"], "model.preset"),
    ("missing init_from", ["train", RUN, "model.init_from={w}/no-model"], "model.init_from"),
    ("yarn without original_max_position_embeddings",
     ["train", RUN, "model.rope_parameters={rope_type: yarn, factor: 4.0}"],
     "model.rope_parameters.original_max_position_embeddings: required for rope_type 'yarn'"),
    ("llama3 without original_max_position_embeddings",
     ["train", RUN,
      "model.rope_parameters={rope_type: llama3, factor: 4.0, low_freq_factor: 1.0, high_freq_factor: 4.0}"],
     "model.rope_parameters.original_max_position_embeddings"),
    ("longrope without original_max_position_embeddings",
     ["train", RUN,
      f"model.rope_parameters={{rope_type: longrope, short_factor: {LONGROPE}, long_factor: {LONGROPE}}}"],
     "model.rope_parameters.original_max_position_embeddings"),
    ("stage yarn without original_max_position_embeddings",
     ["train", RUN, "stages=[{seq_len: 256, steps: 2, rope_parameters: {rope_type: yarn, factor: 2.0}}]"],
     "stages[0].rope_parameters.original_max_position_embeddings"),
    ("rope factor below 1", ["train", RUN, "model.rope_parameters={rope_type: linear, factor: 0.5}"],
     "model.rope_parameters.factor"),
    ("unknown rope type", ["train", RUN, "model.rope_parameters={rope_type: ntk}"], "model.rope_parameters.rope_type"),
    ("model override not a field", ["train", RUN, "model.overrides={hiden_size: 8}"], "model.overrides.hiden_size"),
    # train, checkpoint, log, stages, out_dir, flags
    ("zero steps", ["train", RUN, "train.steps=0"], "train.steps"),
    ("grad accum 0", ["train", RUN, "train.grad_accum=0"], "train.grad_accum"),
    ("unknown dtype", ["train", RUN, "train.dtype=fp16"], "train.dtype"),
    ("negative answer weight", ["train", RUN, "train.answer_loss_weight=-1"], "train.answer_loss_weight"),
    ("negative seed", ["train", RUN, "train.seed=-1"], "train.seed"),
    ("checkpoint every -1", ["train", RUN, "checkpoint.every=-1"], "checkpoint.every"),
    ("peak tflops 0", ["train", RUN, "log.peak_tflops=0"], "log.peak_tflops"),
    ("selective checkpointing every 0", ["train", RUN, "parallel.checkpoint_every=0"], "parallel.checkpoint_every"),
    ("keep_last 0", ["train", RUN, "checkpoint.keep_last=0"], "checkpoint.keep_last"),
    ("missing resume path", ["train", RUN, "checkpoint.resume={w}/no-ckpt"], "checkpoint.resume"),
    ("log every 0", ["train", RUN, "log.every=0"], "log.every"),
    ("stage lr inf", ["train", RUN, "stages=[{seq_len: 256, steps: 2, lr: .inf}]"], "stages[0].lr"),
    ("stage without steps", ["train", RUN, "stages=[{seq_len: 256}]"], "steps"),
    ("out_dir is a file", ["train", "out_dir={w}/empty.yaml"], "out_dir: {w}/empty.yaml is a file"),
    ("out_dir not writable", ["train", "out_dir=/proc/longctx-run"], "out_dir: /proc/longctx-run is not writable"),
    ("unknown train flag", ["train", RUN, "--bogus"], "--bogus: unrecognized"),
    ("bad --world-size", ["train", RUN, "--world-size", "x"], "--world-size: invalid int value"),
    ("--world-size 0", ["train", RUN, "--world-size", "0", "--dry-run"], "--world-size: must be >= 1"),
    ("dry run: cp not dividing the world", ["train", RUN, "--dry-run", "--world-size", "2", "parallel.cp_size=4"],
     "parallel.cp_size"),
    # the validation section (issue 60)
    ("validation every -1", ["train", RUN, "validation.every=-1"], "validation.every: must be an integer >= 0"),
    ("validation every 1.5", ["train", RUN, "validation.every=1.5"], "validation.every"),
    ("validation rows 0", ["train", RUN, "validation.every=2", "validation.rows=0"], "validation.rows"),
    ("validation buckets not increasing", ["train", RUN, "validation.buckets=[64, 32]"],
     "validation.buckets: must be strictly increasing"),
    ("validation buckets beyond the length", ["train", RUN, "data.seq_len=256", "validation.buckets=[64, 512]"],
     "validation.buckets: 512 is beyond the length of stage 0 (data.seq_len=256)"),
    ("validation buckets beyond a stage", ["train", RUN, "validation.buckets=[64, 256]",
                                           "stages=[{seq_len: 256, steps: 1}, {seq_len: 128, steps: 1}]"],
     "validation.buckets: 256 is beyond the length of stage 1 (stages[1].seq_len=128)"),
    ("validation sources empty", ["train", RUN, "validation.every=2", "validation.sources=[]"],
     "validation.sources: empty"),
    ("validation source missing", ["train", RUN, "validation.every=2", "validation.sources=[{path: /no/such.jsonl}]"],
     "validation.sources[0].path: /no/such.jsonl does not exist"),
    ("validation source empty file", ["train", RUN, "validation.every=2",
                                      "validation.sources=[{path: {w}/data/empty.jsonl}]"],
     "validation.sources[0].path"),
    ("validation source is the training file", ["train", RUN, "validation.every=2",
                                                "data.sources=[{path: {w}/data/int.jsonl}]",
                                                "validation.sources=[{path: {w}/data/int.jsonl}]"],
     "validation.sources[0].path: {w}/data/int.jsonl is read by training source"),
    ("validation source is a copy of the training file", ["train", RUN, "validation.every=2",
                                                          "data.sources=[{path: {w}/data/int.jsonl}]",
                                                          "validation.sources=[{path: {w}/data/int-copy.jsonl}]"],
     "has the same content as"),
    ("validation synthetic seed of training", ["train", RUN, "validation.every=2",
                                               "validation.sources=[{kind: synthetic, synthetic: {seed: 1234}}]"],
     "validation.sources[0].synthetic.seed: 1234 is the corpus seed of training source"),
    ("validation default with file training data", ["train", RUN, "validation.every=2",
                                                    "data.sources=[{path: {w}/data/int.jsonl}]"],
     "validation.sources: required when training reads files"),
    ("validation unknown field", ["train", RUN, "validation.evrey=2"], "did you mean 'validation.every'"),
]
if not flash_available():
    TRAIN.append(("flash without flash-attn", ["train", RUN, "parallel.attention_backend=flash"],
                  "parallel.attention_backend: 'flash' needs flash-attn"))

EVAL = [
    ("model: checkpoint without COMPLETE", ["eval", "--model", "{w}/incomplete/step_0000002"],
     "not a complete checkpoint"),
    ("model: run whose newest checkpoint has no manifest", ["eval", "--model", "{w}/unlisted"], "no MANIFEST.json"),
    ("samples not a number", ["eval", "--model", "{w}/model", "--samples", "abc"],
     "--samples: invalid int value: 'abc'"),
    ("samples 0", ["eval", "--model", "{w}/model", "--samples", "0"], "eval.samples: must be >= 1"),
    ("eval timeout 0", ["eval", "--model", "{w}/model", "--timeout-s", "0"],
     "eval.timeout_s: must be a finite number of seconds > 0, got 0.0"),
    ("eval start-up timeout not a number", ["eval", "--model", "{w}/model", "startup_timeout_s=soon"],
     "eval.startup_timeout_s: must be a number"),
    ("no model", ["eval", "--tasks", "passkey"], "eval.model: required"),
    ("missing model path", ["eval", "--model", "{w}/no-model", "--tasks", "passkey"],
     "{w}/no-model: model path does not exist"),
    ("model dir without config.json", ["eval", "--model", "{w}/data", "--tasks", "passkey"],
     "{w}/data: no config.json"),
    ("model config.json without vocab_size", ["eval", "--model", "{w}/config-without-fields", "--tasks", "passkey"],
     "{w}/config-without-fields/config.json: missing required field 'vocab_size'"),
    ("model without a tokenizer", ["eval", "--model", "{w}/model", "--tasks", "passkey"],
     "eval.tokenizer: {w}/model has no tokenizer files"),
    ("missing tokenizer", ["eval", "--model", "{w}/model", "--tokenizer", "{w}/nope.json"], "eval.tokenizer"),
    ("unknown task", ["eval", "--model", "{w}/model", "--tasks", "niah_single_9"],
     "eval.tasks: unknown task 'niah_single_9'"),
    ("unknown suite", ["eval", "--model", "{w}/model", "--suite", "longbench"], "eval.suite: unknown suite"),
    ("bad length", ["eval", "--model", "{w}/model", "--lengths", "4x"], "eval.lengths: '4x' is not a length"),
    ("zero length", ["eval", "--model", "{w}/model", "--lengths", "0"], "eval.lengths"),
    ("depth outside [0,1]", ["eval", "--model", "{w}/model", "--suite", "niah", "--depths", "2"], "eval.depths"),
    ("depth not a number", ["eval", "--model", "{w}/model", "--suite", "niah", "--depths", "x"],
     "eval.depths: must be a number"),
    ("cp without processes", ["eval", "--model", "{w}/model", "--cp", "2"], "eval.cp=2 needs 2 processes"),
    ("cp 0", ["eval", "--model", "{w}/model", "--cp", "0"], "eval.cp"),
    ("unknown cp impl", ["eval", "--model", "{w}/model", "--cp-impl", "hybrid"], "eval.cp_impl"),
    ("unknown dtype", ["eval", "--model", "{w}/model", "--dtype", "fp8"], "eval.dtype: 'fp8' is not a dtype"),
    ("unknown style", ["eval", "--model", "{w}/model", "--style", "fancy"], "eval.style"),
    ("bad chat template", ["eval", "--model", "{w}/model", "--chat-template", "nope"], "eval.chat_template"),
    ("max new tokens 0", ["eval", "--model", "{w}/model", "--max-new-tokens", "0"], "eval.max_new_tokens"),
    ("threshold above 100", ["eval", "--model", "{w}/model", "--threshold", "101"], "eval.threshold"),
    ("batch size 0", ["eval", "--model", "{w}/model", "--batch-size", "0"], "eval.batch_size"),
    ("missing essay corpus", ["eval", "--model", "{w}/model", "--essay", "{w}/no-essay"],
     "eval.essay: {w}/no-essay does not exist"),
    ("--out is a file", ["eval", "--model", "{w}/model", "--out", "{w}/empty.yaml"],
     "eval.out: {w}/empty.yaml is a file"),
    ("empty --config", ["eval", "--config", "{w}/empty.yaml"], "{w}/empty.yaml: empty config file"),
    ("invalid --config", ["eval", "--config", "{w}/bad.yaml"], "{w}/bad.yaml: invalid YAML"),
    ("unknown option in --config", ["eval", "--config", "{w}/eval_unknown.yaml"],
     "eval.sampels: unknown key; did you mean 'eval.samples'"),
    ("unknown override", ["eval", "--model", "{w}/model", "sampels=3"], "did you mean 'eval.samples'"),
    ("bad number override", ["eval", "--model", "{w}/model", "eval.samples=many"], "eval.samples: must be an integer"),
    ("bad number in --config", ["eval", "--config", "{w}/eval_badnum.yaml"], "eval.samples: must be an integer"),
    ("unknown eval flag", ["eval", "--model", "{w}/model", "--bogus"],
     "--bogus: unrecognized argument(s) for longctx eval"),
]

EXPORT = [
    ("out not empty", ["export", "--checkpoint", "{w}/model", "--out", "{w}/full"], "--out: {w}/full is not empty"),
    ("out is a file", ["export", "--checkpoint", "{w}/model", "--out", "{w}/empty.yaml"], "is not a directory"),
    ("out inside the checkpoint", ["export", "--checkpoint", "{w}/incomplete/step_0000002", "--out",
                                   "{w}/incomplete/step_0000002/hf"], "overlaps the checkpoint"),
    ("checkpoint without COMPLETE", ["export", "--checkpoint", "{w}/incomplete/step_0000002", "--out", "{w}/hf"],
     "{w}/incomplete/step_0000002: not a complete checkpoint"),
    ("its model dir without COMPLETE", ["export", "--checkpoint", "{w}/incomplete/step_0000002/model", "--out",
                                        "{w}/hf"], "not a complete checkpoint"),
    ("checkpoint without manifest", ["export", "--checkpoint", "{w}/unlisted/step_0000003", "--out", "{w}/hf"],
     "no MANIFEST.json"),
    ("unknown dtype", ["export", "--checkpoint", "{w}/model", "--out", "{w}/hf", "--dtype", "fp8"],
     "--dtype: invalid choice 'fp8'"),
    ("missing --out", ["export", "--checkpoint", "{w}/model"], "--out: required"),
    ("missing --checkpoint", ["export", "--out", "{w}/hf"], "--checkpoint: required"),
    ("missing checkpoint path", ["export", "--checkpoint", "{w}/no-ckpt", "--out", "{w}/hf"], "{w}/no-ckpt"),
]

PLAN = [
    ("gpus 0", ["plan", "--gpus", "0"], "--gpus: must be >= 1"),
    ("gpus not a number", ["plan", "--gpus", "x"], "--gpus: invalid int value"),
    ("bad gpu memory", ["plan", "--gpu-mem", "abc"], "--gpu-mem"),
    ("bad seq len", ["plan", "--seq-len", "x"], "--seq-len"),
    ("negative runtime", ["plan", "--runtime-gb", "-1"], "--runtime-gb"),
    ("unknown device", ["plan", "--device", "tpu"], "--device: invalid choice 'tpu'"),
    ("config error", ["plan", "optim.beta1=2"], "optim.beta1"),
    ("micro batch 0", ["plan", "data.micro_batch_size=0"], "data.micro_batch_size"),
    ("cp 0", ["plan", "parallel.cp_size=0"], "parallel.cp_size"),
    ("empty --config", ["plan", "--config", "{w}/empty.yaml"], "empty.yaml: empty config file"),
]

DEMO = [
    ("negative seed", ["demo", "--seed", "-1"], "--seed: must be >= 0"),
    ("seed not a number", ["demo", "--seed", "x"], "--seed: invalid int value"),
    ("--out is a file", ["demo", "--out", "{w}/empty.yaml"], "--out: {w}/empty.yaml exists and is not a directory"),
    ("--out holds other files", ["demo", "--out", "{w}"], "--out: {w} is not empty and not a demo run directory"),
    ("--out not writable", ["demo", "--out", "/proc/longctx-demo"], "--out: /proc/longctx-demo is not writable"),
    ("extra argument", ["demo", "extra"], "extra: unrecognized"),
]

EVAL_FLAGS_FIRST = [  # `longctx eval` with the flag before --model
    ("samples 0", ["eval", "--samples", "0", "--model", "{w}/model"], "eval.samples"),
    ("samples not a number", ["eval", "--samples", "x"], "--samples: invalid int value"),
    ("unknown flag", ["eval", "--bogus"], "--bogus: unrecognized"),
]

TOP = [
    ("command typo", ["trian"], "unknown command 'trian'; did you mean 'train'?"),
    ("no command", [], "a command is required"),
    ("unknown top-level flag", ["--bogus", "train"], "--bogus"),
]

PREFLIGHT = [  # launch/preflight.py, in-process (argv without the script)
    ("world size 0", ["--world-size", "0", "--", RUN], "--world-size: must be >= 1"),
    ("world size not a number", ["--world-size", "x"], "--world-size: invalid int value"),
    ("unknown command", ["--world-size", "2", "--command", "export"], "--command: invalid choice"),
    ("config error", ["--world-size", "2", "--", RUN, "optim.eps=0"], "optim.eps"),
    ("cp above the world", ["--world-size", "2", "--", RUN, "parallel.cp_size=4"],
     "parallel.cp_size: 4 needs at least 4 GPUs"),
    ("recipe for more GPUs", ["--world-size", "2", "--", "--config", "configs/smollm2-135m-32k.yaml", RUN,
                              "parallel.cp_size=2", "train.grad_accum=1"],
     "is written for 8 GPUs (nodes=1 x gpus_per_node=8, global batch 32 rows) but this job has 2; submit with "
     "--nodes=1 --gpus-per-node=8, or set LONGCTX_ALLOW_FEWER_GPUS=1 to run it smaller "
     "(train.grad_accum=32 keeps the global batch of 32 rows)"),  # the recipe's batch, not the overrides'
    ("eval option", ["--world-size", "2", "--command", "eval", "--", "--model", "{w}/model", "--samples", "0"],
     "eval.samples"),
    ("eval cp vs world", ["--world-size", "3", "--command", "eval", "--", "--model", "{w}/model", "--cp", "2"],
     "eval.cp=2 must divide"),
]

TINY_HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "hidden_size": 64,
                  "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "max_position_embeddings": 4096}
SLURM_ENV = {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "t", "SLURM_JOB_NODELIST": "localhost",
             "SLURM_JOB_NUM_NODES": "1", "SLURM_GPUS_ON_NODE": "2"}
PY = [sys.executable, "-m", "longctx"]
TORCHRUN = ["bash", str(ROOT / "launch" / "torchrun.sh")]
SUBPROCESS = [  # (id, argv, needle, extra environment)
    ("python -m: command typo", [*PY, "eval_"], "did you mean 'eval'", {}),
    ("python -m: beta1", [*PY, "train", RUN, "optim.beta1=1.5"], "optim.beta1", {}),
    ("python -m: eval samples", [*PY, "eval", "--samples", "abc"], "--samples", {}),
    ("torchrun.sh: option without value", [*TORCHRUN, "--nnodes"], "--nnodes: needs a value", {}),
    ("torchrun.sh: nproc 0", [*TORCHRUN, "--nproc-per-node", "0", "--", "train"], "--nproc-per-node", {}),
    ("torchrun.sh: bad endpoint", [*TORCHRUN, "--rdzv-endpoint", "node1", "--", "train"], "--rdzv-endpoint", {}),
    ("torchrun.sh: multi-node without endpoint", [*TORCHRUN, "--nnodes", "2", "--", "train"], "--rdzv-endpoint", {}),
    ("torchrun.sh: command typo", [*TORCHRUN, "--", "trian"], "unknown longctx command 'trian'", {}),
    ("torchrun.sh: unknown option", [*TORCHRUN, "--bogus"], "unknown option --bogus", {}),
    ("torchrun.sh: no command", [*TORCHRUN], "no longctx command", {}),
    ("torchrun.sh: bad LONGCTX_NPROC_PER_NODE", [*TORCHRUN, "--", "train"], "LONGCTX_NPROC_PER_NODE",
     {"LONGCTX_NPROC_PER_NODE": "abc"}),
    ("torchrun.sh: train config error", [*TORCHRUN, "--nproc-per-node", "2", "--", "train", RUN, "optim.eps=0"],
     "optim.eps", {}),
    ("torchrun.sh: eval option error", [*TORCHRUN, "--nproc-per-node", "2", "--", "eval", "--model", "{w}/no-model"],
     "no-model", {}),
    ("train.sbatch: config error", ["bash", str(ROOT / "slurm/train.sbatch"), "{w}/job.yaml", "optim.beta1=2"],
     "optim.beta1", SLURM_ENV),
    ("train.sbatch: missing config", ["bash", str(ROOT / "slurm/train.sbatch"), "{w}/nope.yaml"],
     "config {w}/nope.yaml does not exist", SLURM_ENV),
    ("eval.sbatch: no arguments", ["bash", str(ROOT / "slurm/eval.sbatch")], "usage: sbatch slurm/eval.sbatch",
     SLURM_ENV),
    ("eval_array.sbatch: bad length", ["bash", str(ROOT / "slurm/eval_array.sbatch"), "{w}/model", "{w}/eval"],
     "LONGCTX_EVAL_LENGTHS: 'abc'", {**SLURM_ENV, "SLURM_ARRAY_TASK_ID": "0", "LONGCTX_EVAL_LENGTHS": "abc"}),
]


# ------------------------------------------------------------------------------ the working dir
def make_workdir(w: Path) -> Path:
    """The files the cases point at: bad configs, bad data, a model dir without weights."""
    data = w / "data"
    data.mkdir(parents=True)
    (w / "empty.yaml").write_text("")
    (w / "comments.yaml").write_text("# nothing but a comment\n")
    (w / "list.yaml").write_text("- train\n- steps\n")
    (w / "bad.yaml").write_text("train: [steps\n")
    (w / "scalar_section.yaml").write_text("optim: 3\n")
    (w / "corrupt_ds.json").write_text('{"zero_optimization": {"stage": 0,')
    (w / "list_ds.json").write_text("[1, 2]")
    (w / "eval_unknown.yaml").write_text("sampels: 3\n")
    (w / "eval_badnum.yaml").write_text(f"samples: many\nmodel: {w / 'model'}\n")
    (w / "job.yaml").write_text(f"out_dir: {w / 'run'}\ntrain: {{steps: 2}}\n")
    (data / "empty.jsonl").write_text("")
    (data / "malformed.jsonl").write_text('{"text": "a"\n{"text": "b"}\n')
    (data / "content.jsonl").write_text('{"content": "hello"}\n')
    (data / "lists.jsonl").write_text("[1, 2]\n")
    (data / "corrupt.parquet").write_bytes(b"not parquet at all")
    (data / "table.csv").write_text("title,body\na,b\n")
    (data / "table.xyz").write_text("text\n")
    good = "".join(json.dumps({"text": f"row {i} of good text"}) + "\n" for i in range(150))
    (data / "nonutf8.jsonl").write_bytes(good.encode() + b'{"text": "caf\xe9"}\n')
    (data / "int.jsonl").write_text(good + '{"text": 7}\n')
    (data / "int-copy.jsonl").write_text(good + '{"text": 7}\n')
    (data / "broken.jsonl").write_text(good + '{"text": "unterminated}\n')
    (data / "trunc.jsonl.gz").write_bytes(gzip.compress((good * 20).encode())[:-40])
    (w / "tokenizer-config-only").mkdir()
    (w / "tokenizer-config-only" / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096}))
    (w / "model").mkdir()  # a valid tiny config without weights or tokenizer
    (w / "model" / "config.json").write_text(json.dumps(TINY_HF_CONFIG))
    (w / "config-without-fields").mkdir()
    (w / "config-without-fields" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (w / "full").mkdir()
    (w / "full" / "README.md").write_text("someone's notes")
    for run, step, complete in (("incomplete", 2, False), ("unlisted", 3, True)):  # checkpoint layouts
        ckpt = w / run / "checkpoints" / f"step_{step:07d}" if run == "unlisted" else w / run / f"step_{step:07d}"
        (ckpt / "ds").mkdir(parents=True)
        (ckpt / "model").mkdir()
        (ckpt / "model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
        if complete:
            (ckpt / "COMPLETE").write_text(f"{step}\n")
    (w / "unlisted" / "step_0000003").symlink_to(w / "unlisted" / "checkpoints" / "step_0000003")
    return w


def listing(w: Path) -> dict:
    """Every path under w: files with (size, mtime), directories by name (a probe file made and
    removed inside one changes its mtime, not its contents)."""
    out = {}
    for root, dirs, files in os.walk(w):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), w)] = "dir"
        for f in files:
            st = os.stat(os.path.join(root, f))
            out[os.path.relpath(os.path.join(root, f), w)] = (st.st_size, st.st_mtime_ns)
    return out


def fill(argv: list, w: Path) -> list:
    return [a.replace("{w}", str(w)) for a in argv]


def assert_clean(rc, out: str, err: str, needle: str, w: Path, before: dict) -> None:
    lines = err.strip().splitlines()
    assert rc == 2, f"exit code {rc}; stderr: {err[-2000:]}"
    assert "Traceback" not in out + err, err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert needle.replace("{w}", str(w)) in lines[0], lines[0]
    assert not (w / "run").exists(), "the run directory was created"
    assert listing(w) == before, "files were written or deleted"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("bad-inputs"))


# ------------------------------------------------------------------------------ in-process cases
CLI_CASES = [(f"{group}: {cid}", argv, needle)
             for group, table in (("train", TRAIN), ("eval", EVAL), ("export", EXPORT), ("plan", PLAN),
                                  ("demo", DEMO), ("top", TOP), ("eval flags first", EVAL_FLAGS_FIRST))
             for cid, argv, needle in table]


@pytest.mark.parametrize("case, argv, needle", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_bad_input(workdir, capsys, monkeypatch, case, argv, needle):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    before = listing(workdir)
    rc = main(fill(argv, workdir))
    captured = capsys.readouterr()
    assert_clean(rc, captured.out, captured.err, needle, workdir, before)


@pytest.fixture(scope="module")
def preflight():
    spec = importlib.util.spec_from_file_location("preflight_under_test", ROOT / "launch" / "preflight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, needle", [c[1:] for c in PREFLIGHT], ids=[c[0] for c in PREFLIGHT])
def test_preflight_bad_input(workdir, preflight, capsys, monkeypatch, argv, needle):
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # eval's check sets it for its own process
    before = listing(workdir)
    rc = preflight.main(fill(argv, workdir))
    captured = capsys.readouterr()
    assert_clean(rc, captured.out, captured.err, needle, workdir, before)


# ------------------------------------------------------------------------------ real processes
def _env(w: Path, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM") and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env.update(LONGCTX_PYTHON=sys.executable, LONGCTX_HOME=str(ROOT), LONGCTX_LOG_DIR=str(w / "logs"),
               OMP_NUM_THREADS="1",
               PATH=f"{ROOT / 'tests' / 'helpers' / 'slurm_stubs'}:{Path(sys.executable).parent}:{env.get('PATH', '')}",
               SLURM_STUB_STATE=str(w.parent / f"{w.name}-slurm-state"), PYTHONPATH=str(ROOT))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def subprocess_results(tmp_path_factory):
    """All subprocess cases started at once (each in a working dir of its own), then awaited."""
    started = {}
    for cid, argv, _needle, extra in SUBPROCESS:
        w = make_workdir(tmp_path_factory.mktemp("proc"))
        before = listing(w)
        proc = subprocess.Popen(fill(argv, w), cwd=w, env=_env(w, extra), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        started[cid] = (proc, w, before)
    results = {}
    for cid, (proc, w, before) in started.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        results[cid] = (proc.returncode, out, err, w, before)
    return results


@pytest.mark.parametrize("cid, needle", [(c[0], c[2]) for c in SUBPROCESS], ids=[c[0] for c in SUBPROCESS])
def test_process_bad_input(subprocess_results, cid, needle):
    rc, out, err, w, before = subprocess_results[cid]
    assert_clean(rc, out, err, needle, w, before)
    assert not (w / "logs").exists(), "a launcher created its log directory"
