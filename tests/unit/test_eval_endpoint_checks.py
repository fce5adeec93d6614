"""`longctx eval --endpoint`'s checks and failure handling, against a stand-in server that says what
vLLM and llama.cpp say about themselves and fails on cue (tests/helpers/openai_standin.py): bad
input is one `error:` line and exit code 2 before any prompt is sent and before --out exists;
429 / 5xx are retried, a refused request stops the eval with its finished cells kept; the API
key is sent and never written. The real server: tests/integration/test_eval_endpoint.py."""
import json
import socket

import pytest

from helpers.openai_standin import Script, standins
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer

BYTE = load_tokenizer("byte")
RUN = ["--tokenizer", "byte", "--tasks", "niah_single_1,passkey", "--lengths", "256", "--samples", "2",
       "--style", "compact", "--no-progress"]


@pytest.fixture
def standin():
    yield from standins()


def _eval(args, capsys) -> tuple[int, str]:
    rc = main(["eval", *args])
    return rc, capsys.readouterr().err


def _error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def _completions(script: Script) -> list:
    return [r for r in script.requests if r[0].endswith("completions")]


def test_an_unreachable_url_is_one_line(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc, err = _eval(["--endpoint", f"http://127.0.0.1:{port}", *RUN, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2
    assert _error_line(err).startswith(f"error: eval.endpoint: cannot reach http://127.0.0.1:{port}/v1/models")
    assert not (tmp_path / "out").exists()


def test_a_model_the_server_does_not_list_names_the_ones_it_does(standin, tmp_path, capsys):
    script = Script(models=[{"id": "org/a"}, {"id": "org/b"}])
    url = standin(script)
    out = str(tmp_path / "out")
    rc, err = _eval(["--endpoint", url, "--served-model", "org/c", *RUN, "--out", out], capsys)
    assert rc == 2
    assert _error_line(err) == f"error: eval.served_model: {url} does not serve 'org/c'; it lists: org/a, org/b"
    rc, err = _eval(["--endpoint", url, *RUN, "--out", out], capsys)  # two models, none named
    assert rc == 2 and "eval.served_model: required" in _error_line(err) and "org/a, org/b" in err
    assert not _completions(script) and not (tmp_path / "out").exists()


def test_a_prompt_longer_than_the_servers_limit_is_refused_before_any_is_sent(standin, tmp_path, capsys):
    script = Script(models=[{"id": "served", "max_model_len": 200}])  # vLLM's /v1/models field
    url = standin(script)
    rc, err = _eval(["--endpoint", url, *RUN, "--out", str(tmp_path / "out")], capsys)
    line = _error_line(err)
    assert rc == 2 and line.startswith("error: eval.lengths: ") and "at 256 are longer than served's limit" in line
    assert "200 tokens, prompt and answer: max_model_len in /v1/models" in line and "--max-model-len" in line
    assert not _completions(script) and not (tmp_path / "out").exists()


def test_a_tokenizer_that_disagrees_with_the_served_model_is_refused(standin, tmp_path, capsys):
    other = Script(tokenize=lambda text, special: [i + 1 for i in BYTE.encode(text, add_bos=False)])  # vLLM's /tokenize
    rc, err = _eval(["--endpoint", standin(other), *RUN, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and "eval.tokenizer: byte tokenizes differently from served" in _error_line(err)
    assert not _completions(other)
    llama_cpp = Script(models=[{"id": "served", "meta": {"n_vocab": 32000}}])  # llama.cpp's /v1/models
    rc, err = _eval(["--endpoint", standin(llama_cpp), *RUN, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and f"eval.tokenizer: byte has {BYTE.vocab_size} tokens but served" in _error_line(err)
    assert not _completions(llama_cpp) and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, field", [
    (["--tasks", "passkey", "--lengths", "256"], "eval.tokenizer: required with --endpoint"),
    (RUN + ["--endpoint-mode", "chat", "--chat-template", "chatml"], "eval.chat_template: endpoint_mode chat"),
    (RUN + ["--endpoint-mode", "batch"], "eval.endpoint_mode: 'batch' is not valid"),
    (RUN + ["--concurrency", "0"], "eval.concurrency: must be >= 1"),
    (RUN + ["--suite", "ppl"], "eval.suite: not with --endpoint"),
    (RUN + ["--mode", "teacher_forced"], "eval.mode: not with --endpoint"),
    (RUN + ["--dtype", "fp32"], "eval.dtype: not with --endpoint"),
])
def test_options_the_endpoint_cannot_take_are_one_line(args, field, tmp_path, capsys):
    rc, err = _eval(["--endpoint", "http://127.0.0.1:9/v1", *args, "--out", str(tmp_path / "out")], capsys)
    assert rc == 2 and _error_line(err).startswith(f"error: {field}")
    assert not (tmp_path / "out").exists()


def test_retries_on_429_and_5xx_and_the_api_key_is_sent_never_written(standin, tmp_path, capsys, monkeypatch):
    secret = "sk-longctx-test-0123456789"
    monkeypatch.setenv("SERVED_KEY", secret)
    busy = {0: (503, {}), 1: (429, {"Retry-After": "0"}), 2: (502, {"Retry-After": "0"})}
    script = Script(tokenize=lambda text, special: BYTE.encode(text, add_bos=special), fail=lambda n, body: busy.get(n))
    out = tmp_path / "out"
    rc, err = _eval(["--endpoint", standin(script), *RUN, "--concurrency", "1", "--api-key-env", "SERVED_KEY",
                     "--out", str(out)], capsys)
    assert rc == 0, err
    assert len(_completions(script)) == 4 + len(busy)  # 2 tasks x 2 samples, and the three retried
    assert all(r[1].get("Authorization") == f"Bearer {secret}" for r in script.requests)
    results = json.loads((out / "results.json").read_text())
    assert [r["prediction"] for r in results["samples"]] == [" 1234567"] * 4
    assert results["meta"]["served_model"] == "served" and results["meta"]["endpoint"].startswith("http://127.0.0.1")
    assert "tokenizer agrees with /tokenize" in results["meta"]["server"]["checks"]
    written = [p.read_bytes() for p in out.rglob("*") if p.is_file()]
    assert written and not any(secret.encode() in data for data in written)
    assert secret not in err and secret not in capsys.readouterr().out


def test_a_refused_request_stops_the_eval_and_the_rerun_finishes_the_rest(standin, tmp_path, capsys):
    refuse = {"on": True}
    script = Script(fail=lambda n, body: (400, {}) if refuse["on"] and n >= 2 else None)  # niah's 2 pass
    url = standin(script)
    out = tmp_path / "out"
    args = ["--endpoint", url, *RUN, "--concurrency", "2", "--out", str(out)]
    rc, err = _eval(args, capsys)
    line = _error_line(err)
    assert rc == 1 and line.startswith("error: the endpoint failed: passkey at 256, sample ")
    assert "HTTP 400: scripted failure 400" in line and "stopped with 1 of 2 cells done" in line
    assert line.endswith("the server refuses the request: once that is fixed, the same command continues from them")
    first = json.loads((out / "cells/256/niah_single_1.json").read_text())
    assert first["complete"] and first["computed_with"][0]["endpoint"] == url
    assert not (out / "results.json").exists() and not (out / "PREEMPTED").exists()  # nothing to requeue
    refuse["on"] = False
    sent = len(_completions(script))
    rc, err = _eval(args, capsys)
    assert rc == 0, err
    assert "resuming: 1 of 2 cells already done" in err
    assert len(_completions(script)) - sent == 2  # only passkey's samples
    assert json.loads((out / "cells/256/niah_single_1.json").read_text()) == first


def test_chat_mode_refused_by_the_server_is_one_line_before_any_prompt(standin, tmp_path, capsys):
    script = Script(fail=lambda n, body: (400, {}) if "messages" in body else None)  # no chat template
    rc, err = _eval(["--endpoint", standin(script), *RUN, "--endpoint-mode", "chat", "--out", str(tmp_path / "o")],
                    capsys)
    assert rc == 2 and "eval.endpoint_mode: " in _error_line(err) and "refuses chat requests for served" in err
    assert len(_completions(script)) == 1 and not (tmp_path / "o").exists()  # the 1-token probe only


def test_chat_mode_sends_the_prompt_as_one_user_message(standin, tmp_path, capsys):
    script = Script()
    rc, err = _eval(["--endpoint", standin(script), *RUN, "--endpoint-mode", "chat", "--out", str(tmp_path / "o")],
                    capsys)
    assert rc == 0, err
    bodies = [r[2] for r in _completions(script)]
    assert all(r[0] == "/v1/chat/completions" for r in _completions(script))
    assert all(b["temperature"] == 0 and len(b["messages"]) == 1 and b["messages"][0]["role"] == "user"
               for b in bodies)
    meta = json.loads((tmp_path / "o/results.json").read_text())["meta"]
    assert meta["endpoint_mode"] == "chat" and meta["chat_template"]["choice"] == "server"


def test_ruler_data_goes_through_the_endpoint_into_rulers_files(standin, tmp_path, capsys):
    data = tmp_path / "data"
    assert main(["eval", "--write-data", str(data), "--tokenizer", "byte", "--tasks", "niah_single_1",
                 "--lengths", "256", "--samples", "2", "--style", "compact"]) == 0
    script = Script()
    out = tmp_path / "out"
    rc, err = _eval(["--endpoint", standin(script), "--tokenizer", "byte", "--ruler-data", str(data),
                     "--no-progress", "--out", str(out)], capsys)
    assert rc == 0, err
    sent = [r[2]["prompt"] for r in _completions(script)]
    lines = [json.loads(x) for x in (data / "256/data/niah_single_1/validation.jsonl").read_text().splitlines()]
    assert sorted(sent) == sorted(x["input"] + x["answer_prefix"] for x in lines)  # RULER's input, as call_api.py
    preds = [json.loads(x) for x in (out / "ruler/256/pred/niah_single_1.jsonl").read_text().splitlines()]
    assert [p["pred"] for p in preds] == [" 1234567"] * 2
    assert json.loads((out / "results.json").read_text())["meta"]["suite"] == "ruler_data"
