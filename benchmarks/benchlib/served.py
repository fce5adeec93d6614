"""A tiny model behind a real OpenAI-compatible server (`transformers serve`, CPU, fp32), for the
endpoint backend's tests and benchmark.

    model = write_tiny_model(tmp / "hf")            # weights + the byte tokenizer's HF files
    server = ServedModel(model, port, log=tmp / "serve.log").start()   # waits for /v1/models
    server.url   # http://127.0.0.1:PORT/v1 ; server.stop() / server.kill()
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import httpx

BYTE_VOCAB = 259  # the byte tokenizer's 256 bytes + BOS, EOS, PAD: every id the model emits decodes
# a chat template of the tokenizer's own: the eval applies it on its side (completions), the server on its (chat)
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def write_tiny_model(directory: Path, max_position_embeddings: int = 4096) -> Path:
    """debug-tiny (random, fp32) with the byte tokenizer's tokenizer.json, as `longctx export` writes a run's,
    and a chat template (chat_template.jinja)."""
    import longctx
    from longctx.data.hf_tokenizer import TokenizerFiles
    from longctx.model import build_model, get_preset

    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=max_position_embeddings,
                     vocab_size=BYTE_VOCAB)
    longctx.save_pretrained(build_model(cfg, seed=0).eval(), directory, tokenizer=TokenizerFiles("byte"))
    (Path(directory) / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return Path(directory)


def transformers_cli() -> str:
    """The `transformers` command of this Python's environment."""
    return str(Path(sys.executable).with_name("transformers"))


class ServedModel:
    """`transformers serve MODEL` on 127.0.0.1:port (CPU, fp32), in its own process group."""

    def __init__(self, model_dir: Path, port: int, *, log: Path, extra: tuple = (), threads: Optional[int] = None):
        self.model_dir, self.port, self.log, self.extra, self.threads = Path(model_dir), port, Path(log), extra, threads
        self.proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        return str(self.model_dir)  # the name a pinned `transformers serve` lists

    def start(self, timeout_s: float = 300.0) -> "ServedModel":
        env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
        if self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        cmd = [transformers_cli(), "serve", str(self.model_dir), "--host", "127.0.0.1", "--port", str(self.port),
               "--device", "cpu", "--dtype", "float32", *self.extra]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/models", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"transformers serve did not answer in {timeout_s} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL to the server's process group: it is gone at once, as a crashed server is."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
