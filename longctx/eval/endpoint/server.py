"""What an OpenAI-compatible server says about itself, checked before any prompt is sent.

    info = probe(client, served_model=None, tokenizer=tok, tokenizer_name="meta-llama/...")
    # then eval/endpoint/lengths.py: every prompt against its limits, counted as the server counts it

`probe` reads `/v1/models` (an unreachable URL, or a model the server does not list, is one
UserError line), the server's context limit where it publishes one (vLLM's and SGLang's
`max_model_len` in /v1/models, llama.cpp's `n_ctx` in /props, TGI's `max_total_tokens` and its
prompt limit `max_input_tokens` in /info, vLLM's /tokenize), and, where the server tokenizes on
request (vLLM's, SGLang's and llama.cpp's /tokenize) or states its vocabulary size (llama.cpp's
`n_vocab`), whether our tokenizer agrees with the served model's: the haystacks are sized with
ours, so a different one would make every length wrong. In chat mode, one 1-token chat request
(a model without a chat template is refused here) whose `usage.prompt_tokens` measures the
server's template. What the server did not say is not checked, and `checks` records what was.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from longctx.base.errors import UserError
from longctx.eval.endpoint.client import EndpointClient, EndpointError

# words, digits, spacing and non-ASCII: where two tokenizers of one family would differ
PROBE_TEXT = "One of the special magic numbers for long-context is: 7340291.\n  Ünïcödé, 東京 ✓ (x=42)"
CHAT_PROBE = "Hello"  # the chat check's user message: the server's count of it less ours is its template


@dataclass
class ServerInfo:
    """The served model, the names the server lists, its context limit (prompt and answer, in
    tokens; None when it publishes none), its prompt limit (TGI's max_input_tokens) and where
    they came from, what the server measured (the chat check's prompt tokens, whether it
    tokenizes on request), and what was checked."""

    url: str
    model: str
    listed: list
    limit: Optional[int] = None
    limit_source: Optional[str] = None
    input_limit: Optional[int] = None
    input_limit_source: Optional[str] = None
    chat_prompt_tokens: Optional[int] = None  # usage.prompt_tokens of the chat check (CHAT_PROBE)
    chat_overhead: Optional[int] = None  # tokens the server's chat template adds to a prompt (lengths.py)
    tokenizes: bool = False  # /tokenize answers with token ids
    checks: list = field(default_factory=list)

    def record(self) -> dict:
        """results.json's meta["server"]."""
        return {"url": self.url, "model": self.model, "context_limit": self.limit, "limit_source": self.limit_source,
                "input_limit": self.input_limit, "input_limit_source": self.input_limit_source,
                "chat_template_tokens": self.chat_overhead, "checks": list(self.checks)}


def probe(client: EndpointClient, served_model: Optional[str], tokenizer, tokenizer_name: str,
          mode: str = "completions") -> ServerInfo:
    """The server's answers, checked (see the module docstring); UserError for what stops the eval.
    mode chat: one 1-token chat request, so a model the server has no chat template for is refused here."""
    models = _models(client)
    listed = [str(m.get("id")) for m in models if isinstance(m, dict) and m.get("id") is not None]
    if served_model is None:
        if len(listed) != 1:
            names = ", ".join(listed) if listed else "none"
            raise UserError(f"eval.served_model: required: {client.url} lists {len(listed)} models ({names}); pass "
                            "--served-model NAME")
        served_model = listed[0]
    elif served_model not in listed:
        raise UserError(f"eval.served_model: {client.url} does not serve {served_model!r}; it lists: "
                        f"{', '.join(listed) or 'no models'}")
    entry = next(m for m in models if isinstance(m, dict) and str(m.get("id")) == served_model)
    info = ServerInfo(client.url, served_model, listed, checks=[f"{served_model} is listed in /v1/models"])
    _context_limit(client, entry, info)
    _check_vocab(entry, tokenizer, tokenizer_name, info)
    _check_tokenize(client, served_model, tokenizer, tokenizer_name, info)
    if info.limit is not None:
        info.checks.append(f"context limit {info.limit} ({info.limit_source})")
    if info.input_limit is not None:
        info.checks.append(f"prompt limit {info.input_limit} ({info.input_limit_source})")
    if mode == "chat":
        _check_chat(client, served_model, info)
    return info


def _check_chat(client: EndpointClient, model: str, info: ServerInfo) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": CHAT_PROBE}], "max_tokens": 1,
            "temperature": 0.0}
    try:
        answer = client.post("chat/completions", body, retries=0)
    except EndpointError as e:
        if e.retryable:
            return  # busy or down: the eval's own requests retry
        if not (e.status or 0) >= 400:
            raise UserError(f"eval.endpoint: {client.url} gives a broken answer to a chat request ({e.reason}); "
                            "check the server, or a proxy between, with one request by hand") from None
        raise UserError(f"eval.endpoint_mode: {client.url} refuses chat requests for {model} ({e.reason}); use "
                        "endpoint_mode completions (the template applied here), or serve the model with a chat "
                        "template") from None
    info.checks.append("a chat request is answered")
    usage = answer.get("usage") if isinstance(answer, dict) else None
    info.chat_prompt_tokens = _positive_int(usage.get("prompt_tokens")) if isinstance(usage, dict) else None


def _models(client: EndpointClient) -> list:
    try:
        answer = client.get("models")
    except EndpointError as e:
        if e.status in (401, 403):
            raise UserError(f"eval.api_key_env: {client.url} refuses the request ({e.reason}); set the variable "
                            "--api-key-env names to the server's API key") from None
        if e.retryable:
            raise UserError(f"eval.endpoint: cannot reach {e.reason}; is the server running and the "
                            "URL right (its OpenAI API root, e.g. http://localhost:8000/v1)?") from None
        raise UserError(f"eval.endpoint: {client.url} is not an OpenAI-compatible API ({e.reason}); give the API "
                        "root, e.g. http://localhost:8000/v1") from None
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise UserError(f"eval.endpoint: {client.url}/models does not list models ({client.mask(str(answer)[:80])}); "
                        "give an OpenAI-compatible API root, e.g. http://localhost:8000/v1")
    return data


def _positive_int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _context_limit(client: EndpointClient, entry: dict, info: ServerInfo) -> None:
    """info.limit and info.input_limit (with where the server said so), where it says."""
    limit = _positive_int(entry.get("max_model_len"))
    if limit:
        info.limit, info.limit_source = limit, "max_model_len in /v1/models"
        return
    for path, keys, source in (("props", ("default_generation_settings", "n_ctx"), "n_ctx in /props"),
                               ("info", ("max_total_tokens",), "max_total_tokens in /info")):
        try:
            answer = client.get(path, root=True)
        except EndpointError:
            continue
        found = answer
        for key in keys:
            found = found.get(key) if isinstance(found, dict) else None
        if _positive_int(found):
            info.limit, info.limit_source = found, source
            if path == "info":  # TGI: the prompt alone has a limit too (max_input_length before 2.0)
                for name in ("max_input_tokens", "max_input_length"):
                    if _positive_int(answer.get(name)):
                        info.input_limit, info.input_limit_source = answer[name], f"{name} in /info"
                        break
            return


def _check_vocab(entry: dict, tokenizer, tokenizer_name: str, info: ServerInfo) -> None:
    """llama.cpp's /v1/models states the vocabulary size (meta.n_vocab)."""
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    served = _positive_int(meta.get("n_vocab"))
    ours = getattr(tokenizer, "vocab_size", None)
    if served is None or ours is None:
        return
    if served != ours:
        raise UserError(f"eval.tokenizer: {tokenizer_name} has {ours} tokens but {info.model} at {info.url} has "
                        f"{served} (n_vocab in /v1/models); pass the served model's own tokenizer with --tokenizer")
    info.checks.append(f"vocabulary size {served} (n_vocab in /v1/models)")


def _check_tokenize(client: EndpointClient, model: str, tokenizer, tokenizer_name: str, info: ServerInfo) -> None:
    """vLLM's and SGLang's /tokenize (model, prompt) and llama.cpp's (content) give the served model's
    token ids."""
    body = {"model": model, "prompt": PROBE_TEXT, "content": PROBE_TEXT, "add_special_tokens": False}
    try:
        answer = client.post("tokenize", body, retries=0, root=True)
    except EndpointError:
        return  # the server tokenizes on no request: nothing to compare
    served = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(served, list) or not all(isinstance(t, int) for t in served):
        return  # llama.cpp's with_pieces form, or another shape: not comparable
    info.tokenizes = True
    ours = list(tokenizer.encode(PROBE_TEXT, add_bos=False))
    if info.limit is None and _positive_int(answer.get("max_model_len")):
        info.limit, info.limit_source = answer["max_model_len"], "max_model_len in /tokenize"
    if served != ours:
        at = next((i for i, (a, b) in enumerate(zip(ours, served)) if a != b), min(len(ours), len(served)))
        raise UserError(f"eval.tokenizer: {tokenizer_name} tokenizes differently from {model} at {info.url}: "
                        f"{len(ours)} vs the server's {len(served)} tokens for a probe text (first difference at "
                        f"token {at}); the haystacks would be sized wrong: pass the served model's own tokenizer "
                        "with --tokenizer")
    info.checks.append("tokenizer agrees with /tokenize")
