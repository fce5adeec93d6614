"""A stand-in OpenAI-compatible server for the endpoint backend's checks: it says what real servers
say about themselves (vLLM's max_model_len in /v1/models and /tokenize, llama.cpp's n_vocab,
TGI's /info) and fails on cue (429, 5xx, 400, a body that does not decode, a reset connection, a
wrong `usage`), which a real server does not do on demand. What the backend sends and scores is
tested against a real server (tests/integration/test_eval_endpoint.py).

    script = Script(fail=lambda n, body: (503, {}) if n == 0 else None)
    url = start(script)        # start: from standins(), a fixture's body; the server runs in a thread
"""
from __future__ import annotations

import json
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, Optional

BREAKS = ("gzip", "reset", "usage")  # what `breaks` may answer: a mangled gzip body, a reset, usage as a list


@dataclass
class Script:
    """What the stand-in answers. models: /v1/models entries; info: TGI's /info (None: 404);
    tokenize(text, add_special): ids for /tokenize (None: 404); fail(n, body): (status, headers) or
    (status, headers, message) for the n-th completion request (0-based), or None to answer;
    breaks(n, body): one of BREAKS, or None; hold(n, body): seconds to wait before answering;
    template: the tokens a chat request's usage.prompt_tokens adds to its message's (the server's
    chat template); answer: the text every completion gets."""

    models: list = field(default_factory=lambda: [{"id": "served", "object": "model"}])
    info: Optional[dict] = None
    tokenize: Optional[Callable[[str, bool], list]] = None
    fail: Callable[[int, dict], Optional[tuple]] = lambda n, body: None
    breaks: Callable[[int, dict], Optional[str]] = lambda n, body: None
    hold: Callable[[int, dict], float] = lambda n, body: 0.0
    template: int = 0
    answer: str = " 1234567"
    requests: list = field(default_factory=list)  # (path, headers, body) of every request
    completions: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a connection reset on cue is not news
        pass


def serve(script: Script) -> tuple[ThreadingHTTPServer, str]:
    """(the server, its base URL); stop with server.shutdown()."""
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, doc, headers: Optional[dict] = None, data: Optional[bytes] = None) -> None:
            data = json.dumps(doc).encode() if data is None else data
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def _reset(self) -> None:
            """Close with an RST (SO_LINGER 0): the client reads 'connection reset by peer'."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True

        def do_GET(self):
            script.requests.append((self.path, dict(self.headers), None))
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": script.models})
            if self.path == "/info" and script.info is not None:
                return self._send(200, script.info)
            self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            script.requests.append((self.path, dict(self.headers), body))
            if self.path == "/tokenize" and script.tokenize is not None:
                ids = script.tokenize(body["prompt"], body.get("add_special_tokens", True))
                return self._send(200, {"tokens": ids, "count": len(ids)})
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                return self._send(404, {"detail": "Not Found"})
            with lock:
                n = script.completions
                script.completions += 1
            time.sleep(script.hold(n, body))
            broken = script.breaks(n, body)
            if broken == "reset":
                return self._reset()
            if broken == "gzip":  # says gzip, is not
                return self._send(200, None, {"Content-Encoding": "gzip"}, data=b"\x1f\x8b\x08\x00 not gzip at all")
            failure = script.fail(n, body)
            if failure is not None:
                message = failure[2] if len(failure) > 2 else f"scripted failure {failure[0]}"
                return self._send(failure[0], {"error": {"message": message}}, failure[1])
            chat = "chat" in self.path
            choice = {"message": {"role": "assistant", "content": script.answer}} if chat else {"text": script.answer}
            text = body["messages"][0]["content"] if chat else body["prompt"]
            usage = {"prompt_tokens": len(text.encode()) + (script.template if chat else 0), "completion_tokens": 3}
            self._send(200, {"choices": [dict(choice, index=0, finish_reason="stop")],
                             "usage": list(usage.values()) if broken == "usage" else usage})

    server = _Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/v1"


def standins() -> Iterator[Callable[[Script], str]]:
    """A test fixture's body: yields start(script) -> the URL of a stand-in serving it; every one
    started is shut down after the test."""
    servers = []

    def start(script: Script) -> str:
        server, url = serve(script)
        servers.append(server)
        return url

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()
