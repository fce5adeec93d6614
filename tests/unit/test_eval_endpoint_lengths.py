"""Served length checks that match the server, and credentials kept out of every line, against the
stand-in server (tests/helpers/openai_standin.py, in a thread): in chat mode the server's chat
template is measured (the chat check's usage.prompt_tokens) and counted before any prompt is sent;
TGI's max_input_tokens (/info) is a prompt limit; /tokenize's count of the longest prompt is
compared with ours (equal: recorded; a little apart: a warning, and the server's count is used;
more than 1% apart: refused); a URL's user:key, the API key and the server's own words are masked
in every line and file."""
import base64
import json

import pytest

from helpers.openai_standin import Script, standins
from longctx.commands.cli import main
from longctx.data.tokenizer import load_tokenizer

BYTE = load_tokenizer("byte")
RUN = ["--tokenizer", "byte", "--tasks", "niah_single_1,passkey", "--lengths", "256", "--samples", "2",
       "--style", "compact", "--no-progress"]
TEMPLATE = 20  # the stand-in's chat template: tokens its chat usage adds to the message's bytes


@pytest.fixture
def standin():
    yield from standins()


def _eval(args, capsys) -> tuple[int, str]:
    rc = main(["eval", *args])
    return rc, capsys.readouterr().err


def _lines(err: str, kind: str) -> list:
    return [x for x in err.splitlines() if x.startswith(kind)]


def _completions(script: Script) -> list:
    return [r for r in script.requests if r[0].endswith("completions")]


def _need(out) -> int:
    """The longest prompt and its generation budget, as we count them, in a finished eval's --out."""
    samples = json.loads((out / "results.json").read_text())["samples"]
    return max(r["prompt_tokens"] + r["max_new_tokens"] for r in samples)


def test_chat_template_tokens_are_counted_before_any_prompt_is_sent(standin, tmp_path, capsys):
    """The prompts fit a limit of 256 as we count them (completions mode runs); in chat mode the
    server's template adds TEMPLATE tokens to its count (one less than ours: no BOS on its side),
    so they are refused before any is sent; with room, every prompt's count matches the server's."""
    exact = Script(models=[{"id": "served", "max_model_len": 256}], template=TEMPLATE,
                   tokenize=lambda text, special: BYTE.encode(text, add_bos=special))
    url = standin(exact)
    rc, err = _eval(["--endpoint", url, *RUN, "--out", str(tmp_path / "completions")], capsys)
    assert rc == 0, err
    assert _need(tmp_path / "completions") <= 256
    rc, err = _eval(["--endpoint", url, *RUN, "--endpoint-mode", "chat", "--out", str(tmp_path / "chat")], capsys)
    [line] = _lines(err, "error:")
    template = TEMPLATE - 1  # the server's count of "Hello" (5 + 20) less ours (BOS + 5)
    assert rc == 2 and line.startswith("error: eval.lengths: ") and "longer than served's limit" in line
    assert f"+ {template} of the chat template" in line, line
    assert not (tmp_path / "chat").exists()
    assert [r[2].get("messages") for r in _completions(exact)][-1][0]["content"] == "Hello"  # the check only

    roomy = Script(models=[{"id": "served", "max_model_len": 256 + template}], template=TEMPLATE,
                   tokenize=lambda text, special: BYTE.encode(text, add_bos=special))
    rc, err = _eval(["--endpoint", standin(roomy), *RUN, "--endpoint-mode", "chat", "--out", str(tmp_path / "c2")],
                    capsys)
    assert rc == 0, err
    results = json.loads((tmp_path / "c2/results.json").read_text())
    server = results["meta"]["server"]
    assert server["chat_template_tokens"] == template
    assert f"the chat template adds {template} tokens (usage.prompt_tokens of the chat check)" in server["checks"]
    assert any("its text alone" in c and "here and on /tokenize" in c for c in server["checks"])
    cells = [json.loads(p.read_text()) for p in (tmp_path / "c2/cells/256").glob("*.json")]
    served = sum(c["stats"]["prompt_tokens"] for c in cells)  # the server's usage.prompt_tokens, summed
    assert served == sum(r["prompt_tokens"] + template for r in results["samples"])


def test_tgi_max_input_tokens_is_a_prompt_limit(standin, tmp_path, capsys):
    info = {"model_id": "served", "max_input_tokens": 200, "max_total_tokens": 32768}  # TGI's /info
    script = Script(info=info)
    rc, err = _eval(["--endpoint", standin(script), *RUN, "--out", str(tmp_path / "out")], capsys)
    [line] = _lines(err, "error:")
    assert rc == 2 and line.startswith("error: eval.lengths: ") and "longer than served's prompt limit at" in line
    assert "(200 tokens: max_input_tokens in /info)" in line and "--max-input-tokens" in line
    assert not _completions(script) and not (tmp_path / "out").exists()
    roomy = Script(info=dict(info, max_input_tokens=4000))
    rc, err = _eval(["--endpoint", standin(roomy), *RUN, "--out", str(tmp_path / "ok")], capsys)
    assert rc == 0, err
    server = json.loads((tmp_path / "ok/results.json").read_text())["meta"]["server"]
    assert server["input_limit"] == 4000 and server["input_limit_source"] == "max_input_tokens in /info"
    assert server["context_limit"] == 32768 and "prompt limit 4000 (max_input_tokens in /info)" in server["checks"]


def test_the_servers_count_of_the_longest_prompt_is_compared_with_ours(standin, tmp_path, capsys):
    exact = lambda text, special: BYTE.encode(text, add_bos=special)  # noqa: E731
    rc, err = _eval(["--endpoint", standin(Script(tokenize=exact)), *RUN, "--out", str(tmp_path / "a")], capsys)
    assert rc == 0, err
    need = _need(tmp_path / "a")
    checks = json.loads((tmp_path / "a/results.json").read_text())["meta"]["server"]["checks"]
    assert any(c.startswith("the longest prompt (") and "here and on /tokenize" in c for c in checks)
    fits = Script(models=[{"id": "served", "max_model_len": need}], tokenize=exact)
    rc, err = _eval(["--endpoint", standin(fits), *RUN, "--out", str(tmp_path / "b")], capsys)
    assert rc == 0, err

    # one token more on the server's side (long texts only: the probe text's ids still agree)
    plus_one = Script(models=[{"id": "served", "max_model_len": need}],
                      tokenize=lambda text, special: exact(text, special) + ([7] if len(text) > 200 else []))
    rc, err = _eval(["--endpoint", standin(plus_one), *RUN, "--out", str(tmp_path / "c")], capsys)
    [warning] = [x for x in _lines(err, "warning:") if "/tokenize" not in x and "(+1)" in x]
    assert "for the longest prompt (" in warning and "with its count" in warning
    [line] = _lines(err, "error:")
    assert rc == 2 and line.startswith("error: eval.lengths: ") and "+ 1 more on the server's count" in line
    assert not _completions(plus_one) and not (tmp_path / "c").exists()

    far = Script(tokenize=lambda text, special: exact(text, special) + ([7] * 10 if len(text) > 200 else []))
    rc, err = _eval(["--endpoint", standin(far), *RUN, "--out", str(tmp_path / "d")], capsys)
    [line] = _lines(err, "error:")
    assert rc == 2 and line.startswith("error: eval.tokenizer: served at ") and "more than 1% apart" in line
    assert not _completions(far) and not (tmp_path / "d").exists()


def test_credentials_are_masked_in_every_line_and_file(standin, tmp_path, capsys, monkeypatch):
    key, password = "sk-longctx-masked-0123456789", "pw-s3cr3t-word"
    monkeypatch.setenv("SERVED_KEY", key)
    script = Script(fail=lambda n, body: (400, {}, f"no access for http://user:{password}@127.0.0.1:1/v1 with key "
                                                    f"{key}") if n >= 2 else None)
    bare = standin(script)
    url = bare.replace("http://", f"http://user:{password}@")
    out = tmp_path / "out"
    rc, err = _eval(["--endpoint", url, *RUN, "--concurrency", "1", "--api-key-env", "SERVED_KEY", "--out", str(out)],
                    capsys)
    [line] = _lines(err, "error:")
    assert rc == 1 and line.startswith("error: the endpoint failed: passkey at 256, sample 0: http://***@127.0.0.1:")
    assert "no access for http://***@127.0.0.1:1/v1 with key ***" in line
    basic = "Basic " + base64.b64encode(f"user:{password}".encode()).decode()
    assert all(r[1].get("Authorization") == basic for r in script.requests)  # the URL's credentials, sent
    rc, err2 = _eval(["--endpoint", f"ftp://user:{password}@host/v1", *RUN], capsys)  # refused by the config check
    assert rc == 2 and "ftp://***@host/v1" in _lines(err2, "error:")[0]
    monkeypatch.setenv("SERVED_KEY", key + "\n")  # httpx's refusal of such a header would quote it
    rc, err3 = _eval(["--endpoint", bare, *RUN, "--api-key-env", "SERVED_KEY"], capsys)
    [line] = _lines(err3, "error:")
    assert rc == 2 and line.startswith("error: eval.api_key_env: $SERVED_KEY holds characters an HTTP header cannot")
    err2 += err3
    written = [p.read_bytes() for p in out.rglob("*") if p.is_file()]
    assert written and json.loads((out / "cells/256/niah_single_1.json").read_text())["complete"]
    for secret in (key, password):
        assert secret not in err + err2 + capsys.readouterr().out
        assert not any(secret.encode() in data for data in written)
