"""Hub ids ("org/name") for model.init_from, data.tokenizer and `eval --model`, from a Hugging Face
cache laid out as huggingface_hub lays it out, offline; and the one-line errors when the id is not
cached offline, unknown to the Hub, or the Hub cannot be reached. No network: the "Hub" that does
not know an id is a local HTTP server answering as the Hub does (404 + X-Error-Code)."""
import http.server
import json
import socket
import subprocess
import sys
import threading

import pytest
from huggingface_hub import scan_cache_dir

import longctx
from helpers.hub_cache import add_repo, offline_env
from helpers.train import TINY, free_port
from longctx.data.hf_tokenizer import TokenizerFiles
from longctx.model.config import get_preset
from longctx.model.llama import build_model

REPO = "tiny-org/tiny-llama"


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory):
    """HF_HOME whose hub/ cache holds REPO: a debug-tiny model with the byte tokenizer's files."""
    model = tmp_path_factory.mktemp("model")
    cfg = get_preset("debug-tiny", max_position_embeddings=1024)
    longctx.save_pretrained(build_model(cfg, seed=0), model, tokenizer=TokenizerFiles("byte"))
    home = tmp_path_factory.mktemp("hf_home")
    add_repo(home / "hub", REPO, model)
    return home


def _longctx(args, cwd, env):
    return subprocess.run([sys.executable, "-m", "longctx", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def _error_line(res) -> str:
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, res.stderr
    return lines[0]


def test_the_cache_is_huggingface_hubs_own_layout(hub_home):
    info = scan_cache_dir(hub_home / "hub")
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.repo_type == "model"
    (rev,) = repo.revisions
    assert "main" in rev.refs and {f.file_name for f in rev.files} >= {"config.json", "model.safetensors",
                                                                      "tokenizer.json"}


def test_train_and_eval_take_a_hub_id_offline(hub_home, tmp_path):
    """cwd has no tiny-org/ directory: the id resolves through the HF cache only."""
    env = offline_env(hub_home)
    out = tmp_path / "run"
    res = _longctx(["train", f"model.init_from={REPO}", f"data.tokenizer={REPO}", f"out_dir={out}", *TINY,
                    "train.steps=2", "data.seq_len=128"], tmp_path, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"from {REPO} (" in res.stdout + res.stderr  # the weights line names the id and its snapshot
    assert "init_from: tiny-org/tiny-llama" in (out / "resolved_config.yaml").read_text()
    res = _longctx(["eval", "--model", REPO, "--suite", "passkey", "--lengths", "256", "--samples", "2",
                    "--style", "compact", "--max-new-tokens", "4", "--out", str(tmp_path / "eval"),
                    "--no-progress"], tmp_path, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert "snapshots" in json.dumps(results)  # the model evaluated is the cached snapshot


def test_a_local_directory_wins_over_the_hub_id(hub_home, tmp_path):
    """A directory named like an id exists here: it is used, the cache is not asked."""
    local = tmp_path / "tiny-org" / "tiny-llama"
    local.mkdir(parents=True)  # empty: the local directory's own error, not the cached model
    res = _longctx(["train", f"model.init_from={REPO}", f"out_dir={tmp_path / 'run'}"], tmp_path,
                   offline_env(hub_home))
    assert _error_line(res) == f"error: model.init_from: {REPO} has no config.json (expected a Hugging Face Llama " \
                               "directory: config.json and model.safetensors(.index.json))"


def test_an_id_not_in_the_cache_offline_is_one_line(hub_home, tmp_path):
    env = offline_env(hub_home)
    res = _longctx(["train", "model.init_from=nobody/nothing", f"out_dir={tmp_path / 'run'}"], tmp_path, env)
    line = _error_line(res)
    assert line.startswith("error: model.init_from: nobody/nothing is not in the Hugging Face cache (")
    assert "HF_HUB_OFFLINE is set" in line and "or pass a local directory" in line
    assert not (tmp_path / "run").exists()
    line = _error_line(_longctx(["eval", "--model", "nobody/nothing"], tmp_path, env))
    assert line.startswith("error: eval.model: nobody/nothing is not in the Hugging Face cache (")


def test_no_network_is_one_line(hub_home, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(offline_env(hub_home, offline=False), HF_ENDPOINT=f"http://127.0.0.1:{port}")
    res = _longctx(["train", "model.init_from=nobody/nothing", f"out_dir={tmp_path / 'run'}"], tmp_path, env)
    line = _error_line(res)
    assert line.startswith("error: model.init_from: nobody/nothing is not in the Hugging Face cache (")
    assert f"the Hub at http://127.0.0.1:{port} cannot be reached (ConnectError)" in line


class _NoSuchRepo(http.server.BaseHTTPRequestHandler):
    """Answers every request as the Hub answers for a repository it does not have."""

    def do_GET(self):
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("X-Error-Message", "Repository not found")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_an_id_the_hub_does_not_know_is_one_line(hub_home, tmp_path):
    port = free_port()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _NoSuchRepo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = dict(offline_env(hub_home, offline=False), HF_ENDPOINT=f"http://127.0.0.1:{port}")
        res = _longctx(["eval", "--model", "nobody/nothing"], tmp_path, env)
        res_train = _longctx(["train", "model.init_from=nobody/nothing", f"out_dir={tmp_path / 'run'}"], tmp_path,
                             env)
    finally:
        server.shutdown()
    expected = ("nobody/nothing is not a local directory and the Hugging Face Hub has no model by that id; check "
                "the id (org/name) or the path, or set HF_TOKEN if the model is private")
    assert _error_line(res) == f"error: eval.model: {expected}"
    assert _error_line(res_train) == f"error: model.init_from: {expected}"
