"""A stand-in OpenAI-compatible server for the endpoint backend's checks: it says what real servers
say about themselves (vLLM's max_model_len in /v1/models and /tokenize, llama.cpp's n_vocab)
and fails on cue (429, 5xx, 400), which a real server does not do on demand. What the backend
sends and scores is tested against a real server (tests/integration/test_eval_endpoint.py)."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional


@dataclass
class Script:
    """What the stand-in answers. models: /v1/models entries; tokenize: ids for /tokenize (None:
    404); fail(n, body): (status, headers) for the n-th completion request (0-based), or None to
    answer; answer: the text every completion gets."""

    models: list = field(default_factory=lambda: [{"id": "served", "object": "model"}])
    tokenize: Optional[Callable[[str], list]] = None
    fail: Callable[[int, dict], Optional[tuple]] = lambda n, body: None
    answer: str = " 1234567"
    requests: list = field(default_factory=list)  # (path, headers, body) of every request
    completions: int = 0


def serve(script: Script) -> tuple[ThreadingHTTPServer, str]:
    """(the server, its base URL); stop with server.shutdown()."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, doc: dict, headers: Optional[dict] = None) -> None:
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            script.requests.append((self.path, dict(self.headers), None))
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": script.models})
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            script.requests.append((self.path, dict(self.headers), body))
            if self.path == "/tokenize" and script.tokenize is not None:
                return self._send(200, {"tokens": script.tokenize(body["prompt"]), "count": 0})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, {"detail": "Not Found"})
            with lock:
                n = script.completions
                script.completions += 1
            failure = script.fail(n, body)
            if failure is not None:
                return self._send(failure[0], {"error": {"message": f"scripted failure {failure[0]}"}}, failure[1])
            choice = ({"message": {"role": "assistant", "content": script.answer}} if "chat" in self.path
                      else {"text": script.answer})
            self._send(200, {"choices": [dict(choice, index=0, finish_reason="stop")],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 3}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"
