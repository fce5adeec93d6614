"""A served eval keeps what it has when a request fails in any way: against the stand-in server
(tests/helpers/openai_standin.py, in a thread), a body that does not decode (a mangled gzip), a
connection reset on every try, or an answer whose `usage` is not an object each end the eval with
one `error:` line (exit 1, no traceback); the first failure sets `abort`, so a request in flight
that then fails is not tried again; the cell's finished samples are written as a partial cell,
and the rerun sends only the samples that did not finish. A signal (SIGTERM) sets `abort` too."""
import json
import threading
from types import SimpleNamespace

import httpx
import pytest

from helpers.openai_standin import Script, serve, standins
from longctx.commands.cli import main
from longctx.eval.endpoint import client as client_module
from longctx.eval.endpoint.backend import EndpointBackend
from longctx.eval.endpoint.client import EndpointClient, EndpointError
from longctx.eval.tasks import Sample

RETRIES = 3  # a request is sent at most RETRIES + 1 times
HOLD_S = 1.0  # the signal test's request in flight waits this long
AFTER_S = 0.5  # the held request is answered this long after the broken one's last try arrived
WORDS = {"gzip": "the answer's body does not decode (DecodingError", "reset": "the connection broke (",
         "usage": "an answer whose usage is not an object (["}


@pytest.fixture
def standin():
    yield from standins()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(client_module, "BACKOFF_S", 0.02)  # 0.02, 0.04, 0.08 s between tries


class Roles:
    """The stand-in's cue, by the order prompts first arrive after the first cell's 3: the first
    breaks on every try (`kind`), the second is held until AFTER_S after the first's last try and
    then answered 503 (a retryable error that, with `abort` set, is not tried again), the third is
    answered."""

    def __init__(self, kind: str):
        self.kind, self.first_cell, self.order, self.on = kind, set(), [], True
        self.lock = threading.Lock()
        self.tries, self.last_try = 0, threading.Event()

    def breaks(self, body: dict):
        if self.role(body) != "broken":
            return None
        self.tries += 1
        if self.tries == (RETRIES + 1 if self.kind == "reset" else 1):
            self.last_try.set()
        return self.kind

    def hold(self, body: dict) -> float:
        if self.role(body) != "held":
            return 0.0
        self.last_try.wait(10.0)
        return AFTER_S

    def role(self, body: dict) -> str:
        prompt = body["prompt"]
        with self.lock:
            if len(self.first_cell) < 3 or prompt in self.first_cell:
                self.first_cell.add(prompt)
                return "answer"
            if prompt not in self.order:
                self.order.append(prompt)
            return ("broken", "held", "answer")[self.order.index(prompt)] if self.on else "answer"

    def script(self) -> Script:
        return Script(breaks=lambda n, body: self.breaks(body), hold=lambda n, body: self.hold(body),
                      fail=lambda n, body: (503, {}) if self.role(body) == "held" else None)


def _sent(script: Script) -> list:
    return [r[2]["prompt"] for r in script.requests if r[0] == "/v1/completions"]


@pytest.mark.parametrize("kind", ["gzip", "reset", "usage"])
def test_a_broken_answer_is_one_line_and_the_rerun_sends_only_the_rest(kind, standin, tmp_path, capsys):
    roles = Roles(kind)
    script = roles.script()
    out = tmp_path / "out"
    args = ["eval", "--endpoint", standin(script), "--tokenizer", "byte", "--tasks", "niah_single_1,passkey",
            "--lengths", "256", "--samples", "3", "--style", "compact", "--concurrency", "3", "--retries",
            str(RETRIES), "--no-progress", "--out", str(out)]
    assert main(args) == 1
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("error: the endpoint failed: passkey at 256, sample ") and WORDS[kind] in lines[0]
    assert "stopped with 1 of 2 cells done" in lines[0]
    assert lines[0].endswith("run the same command again once the server answers, it continues from them"
                             if kind == "reset" else "the same command continues from them")
    assert ("did not arrive whole" in lines[0]) == (kind != "reset")  # not the server being down
    broken, held, answered = roles.order
    sent = _sent(script)
    assert sent.count(broken) == (RETRIES + 1 if kind == "reset" else 1)  # a reset is retried; the others are not
    assert sent.count(held) == 1 and sent.count(answered) == 1  # abort: the one in flight is not tried again
    partial = json.loads((out / "cells/256/passkey.json").read_text())
    assert not partial["complete"] and len(partial["records"]) == 1  # the answered sample, kept
    assert json.loads((out / "cells/256/niah_single_1.json").read_text())["complete"]

    roles.on = False
    before = len(sent)
    assert main(args) == 0, capsys.readouterr().err
    assert sorted(_sent(script)[before:]) == sorted([broken, held])  # only the two that did not finish
    assert len(json.loads((out / "results.json").read_text())["samples"]) == 6


def _samples(n: int) -> list:
    return [Sample(task="passkey", index=i, input=f"prompt {i}", answer_prefix="", outputs=["1"],
                   metric="string_match_all", target_length=256, max_new_tokens=8, prompt_tokens=10 + i)
            for i in range(n)]


def test_a_signal_sets_abort_the_request_in_flight_is_not_tried_again_and_is_no_failure():
    """SIGTERM (the stop flag agrees) while one request is in flight: it ends 503 and is not tried
    again, nothing new is sent, and the eval stops as preempted (no failure), with the answered
    sample kept and the others left for the rerun."""
    signalled = threading.Event()

    def held(n, body):
        if body["prompt"] == "prompt 1":
            signalled.set()  # the signal arrives while this request is in flight
            return HOLD_S
        signalled.wait(HOLD_S)  # prompt 0 is answered after the signal
        return 0.0

    script = Script(hold=held, fail=lambda n, body: (503, {}) if body["prompt"] == "prompt 1" else None)
    server, url = serve(script)
    client = EndpointClient(url, retries=RETRIES, concurrency=2)
    try:
        backend = EndpointBackend(client, "served", concurrency=2)
        ran = backend.run_cell(_samples(4), stop=SimpleNamespace(agreed=signalled.is_set))
    finally:
        client.close()
        server.shutdown()
        server.server_close()
    sent = _sent(script)
    assert sent.count("prompt 1") == 1 and "prompt 2" not in sent and "prompt 3" not in sent
    assert ran.stop and not ran.finished and backend.failure is None
    assert [r["index"] for r in ran.records] == [0]


def test_a_broken_answer_before_any_prompt_or_a_bad_url_is_one_line(standin, tmp_path, capsys):
    """Before the eval: a mangled body for the chat check, and a URL httpx or urllib cannot parse,
    are one `error:` line each, exit 2, nothing written."""
    script = Script(breaks=lambda n, body: "gzip")
    args = ["--tokenizer", "byte", "--tasks", "passkey", "--lengths", "256", "--samples", "1", "--no-progress",
            "--out", str(tmp_path / "out")]
    for url, words in [(standin(script), "/chat/completions: the answer's body does not decode (DecodingError"),
                       ("http://[::1/v1", "'http://[::1/v1' is not a valid URL (Invalid IPv6 URL)"),
                       ("http://host:port/v1", "'http://host:port/v1' is not a valid URL (Port could not be cast")]:
        assert main(["eval", "--endpoint", url, "--endpoint-mode", "chat", *args]) == 2
        err = capsys.readouterr().err
        lines = [x for x in err.splitlines() if x.startswith("error:")]
        assert len(lines) == 1 and lines[0].startswith("error: eval.endpoint: ") and words in lines[0], err
    assert len(_sent_chat(script)) == 1 and not (tmp_path / "out").exists()


def _sent_chat(script: Script) -> list:
    return [r for r in script.requests if r[0] == "/v1/chat/completions"]


@pytest.mark.parametrize("error, retryable", [
    (httpx.ProxyError("407 Proxy Authentication Required at http://proxy-user:proxy-pw@proxy:3128"), False),
    (httpx.LocalProtocolError("Illegal header value b'Bearer sk-abc123\\n'"), False),
    (httpx.DecodingError("Error -3 while decompressing data"), False),
    (httpx.ReadError("[Errno 104] Connection reset by peer"), True),
])
def test_every_transport_error_is_an_endpoint_error_with_credentials_masked(error, retryable):
    """The client turns each httpx error into an EndpointError (retryable only where another try may
    pass), its words masked: a proxy URL's user:key, and the API key however it is quoted."""
    def raise_it(request):
        raise error

    client = EndpointClient("http://127.0.0.1:9/v1", api_key="sk-abc123\n", retries=0)
    client._http = httpx.Client(transport=httpx.MockTransport(raise_it))
    with pytest.raises(EndpointError) as caught:
        client.post("completions", {})
    assert caught.value.retryable == retryable and type(error).__name__ in caught.value.reason
    assert "proxy-pw" not in caught.value.reason and "sk-abc123" not in caught.value.reason
