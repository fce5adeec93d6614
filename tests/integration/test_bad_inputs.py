"""Every bad input is caught before any work (issue 21): exit code 2, exactly one stderr line
`error: <field or file>: ...` that names the field or file, no traceback, and nothing written or
deleted in the working directory (a recursive listing with sizes and mtimes, before and after).

One case is one tuple, `(id, argv, needle)`: argv is a `longctx` command line (or a launcher's),
"{w}" in it is the working directory, needle a substring the error line must hold. Append new
cases to the table they belong to (the train cases are in tests/helpers/bad_train_inputs.py).
Most run in-process through longctx.commands.cli.main; a few run as real subprocesses
(`python -m longctx`, the shell launchers) to prove exit code and output end to end; those
start together and are awaited together.
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

from helpers.bad_train_inputs import RUN, TRAIN
from longctx.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]

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
    # transformers-path models that cannot be sharded exactly, or were never tested (config.json only)
    moe = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
           "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 512}
    for name, changes in (("linear-attention", {"layer_types": ["linear_attention", "full_attention"]}),
                          ("longrope", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}),
                          ("untested", {"model_type": "bloom", "architectures": ["BloomForCausalLM"]})):
        (w / name).mkdir()
        (w / name / "config.json").write_text(json.dumps({**moe, **changes}))
        (w / name / "model.safetensors").write_bytes(b"")  # refused before any weight is read
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
