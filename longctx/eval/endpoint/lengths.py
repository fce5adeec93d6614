"""Every prompt against the served model's limits, counted as the server counts it, before any is sent.

    check_lengths(client, info, samples, tokenizer, add_bos=True, mode="chat", tokenizer_name="org/x", warn=print)
    # warnings through `warn` as they arise; a prompt too long, or a count far from the server's: one UserError

Our count of a prompt (the same tokenizer as the server's, checked in server.py) is the server's,
plus two things measured on the server:
- chat mode: the tokens of the server's chat template, measured once as the chat check's
  `usage.prompt_tokens` less our count of its message (server.CHAT_PROBE), and added to every
  prompt;
- where the server tokenizes on request (/tokenize: vLLM, SGLang, llama.cpp), its count of the
  longest prompt (as /v1/completions reads it: special tokens added; chat mode: the message's
  text alone). Equal is recorded in `checks`; more than TOLERANCE apart is refused (the haystacks
  would be sized wrong); a smaller difference is a warning, and the server's extra tokens are
  added to every prompt.
Then each prompt, its chat template and its generation budget fit the context limit, and the
prompt and its template fit the prompt limit (TGI's max_input_tokens), where the server
publishes them.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from longctx.base.errors import UserError
from longctx.eval.endpoint.client import EndpointClient, EndpointError
from longctx.eval.endpoint.server import CHAT_PROBE, ServerInfo

TOLERANCE = 0.01  # counts further apart than this (relative) are another tokenizer, not a BOS or a template


def check_lengths(client: EndpointClient, info: ServerInfo, samples: Sequence, tokenizer, *, add_bos: bool,
                  mode: str, tokenizer_name: str, warn: Callable[[str], None]) -> None:
    """UserError for a prompt the server would refuse or a count far from its own; warnings to `warn`."""
    template = 0
    if mode == "chat" and info.chat_prompt_tokens is not None:
        info.chat_overhead = template = info.chat_prompt_tokens - len(tokenizer.encode(CHAT_PROBE, add_bos=add_bos))
        info.checks.append(f"the chat template adds {template} tokens (usage.prompt_tokens of the chat check)")
    elif mode == "chat" and (info.limit is not None or info.input_limit is not None):
        warn(f"{info.url} did not count the chat check's prompt (usage.prompt_tokens): prompts are checked "
             "against its limit without its chat template's tokens")
    more = 0
    if samples and info.tokenizes:
        more, note = _compare_count(client, info, max(samples, key=lambda s: (s.prompt_tokens, s.index)), tokenizer,
                                    mode, tokenizer_name)
        if note:
            warn(note)
    check_prompts(samples, info, template, max(more, 0))


def _compare_count(client: EndpointClient, info: ServerInfo, sample, tokenizer, mode: str,
                   tokenizer_name: str) -> tuple[int, Optional[str]]:
    """(the server's count of `sample` less ours, a warning or None); UserError when far apart."""
    chat = mode == "chat"
    body = {"model": info.model, "prompt": sample.prompt, "content": sample.prompt,
            "add_special_tokens": not chat, "add_special": not chat}  # vLLM and SGLang; llama.cpp
    try:
        answer = client.post("tokenize", body, retries=0, root=True)
    except EndpointError:
        return 0, None  # it tokenized the probe text: a refusal here (a body too large) leaves the count unchecked
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        return 0, None
    served = len(tokens)
    ours = len(tokenizer.encode(sample.prompt, add_bos=False)) if chat else sample.prompt_tokens
    what = f"the longest prompt ({sample.task} at {sample.target_length}{', its text alone' if chat else ''})"
    if served == ours:
        info.checks.append(f"{what} counts {ours} tokens here and on /tokenize")
        return 0, None
    if abs(served - ours) > TOLERANCE * ours:
        raise UserError(f"eval.tokenizer: {info.model} at {info.url} counts {served} tokens for {what} and "
                        f"{tokenizer_name} counts {ours}, more than {TOLERANCE:.0%} apart: the haystacks would be "
                        "sized wrong; pass the served model's own tokenizer with --tokenizer")
    info.checks.append(f"{what} counts {ours} tokens here and {served} on /tokenize")
    return served - ours, (f"{info.url} counts {served} tokens for {what}, {tokenizer_name} {ours} "
                           f"({served - ours:+d}); prompts are checked against its limits with "
                           f"{'its count' if served > ours else 'ours, the larger'}")


def check_prompts(samples: Sequence, info: ServerInfo, template: int = 0, more: int = 0) -> None:
    """Every prompt (with `template` tokens of the server's chat template and `more` it counts
    beyond ours) within the prompt limit, and with its answer budget within the context limit."""
    extra = template + more
    if info.input_limit is not None:
        over = [s for s in samples if s.prompt_tokens + extra > info.input_limit]
        if over:
            worst = max(over, key=lambda s: s.prompt_tokens)
            need = worst.prompt_tokens + extra
            raise UserError(f"eval.lengths: {_prompts(over)} longer than {info.model}'s prompt limit at {info.url} ("
                            f"{info.input_limit} tokens: {info.input_limit_source}); the longest, {worst.task} at "
                            f"{worst.target_length}, has {_terms(worst.prompt_tokens, template, more)}; serve it with "
                            f"a longer one (text-generation-launcher --max-input-tokens {need} --max-total-tokens "
                            f"{need + worst.max_new_tokens}) or leave those lengths out")
    if info.limit is None:
        return
    over = [s for s in samples if s.prompt_tokens + extra + s.max_new_tokens > info.limit]
    if not over:
        return
    worst = max(over, key=lambda s: s.prompt_tokens + s.max_new_tokens)
    need = worst.prompt_tokens + extra + worst.max_new_tokens
    raise UserError(f"eval.lengths: {_prompts(over)} longer than {info.model}'s limit at {info.url} ({info.limit} "
                    f"tokens, prompt and answer: {info.limit_source}); the longest, {worst.task} at "
                    f"{worst.target_length}, needs {need} ({_terms(worst.prompt_tokens, template, more)} + "
                    f"{worst.max_new_tokens} to generate); serve it with a longer context (vllm serve ... "
                    f"--max-model-len {need}) or leave those lengths out")


def _prompts(over: Sequence) -> str:
    lengths = ", ".join(map(str, sorted({s.target_length for s in over})))
    return f"{len(over)} prompts at {lengths} are" if len(over) != 1 else f"1 prompt at {lengths} is"


def _terms(prompt: int, template: int, more: int) -> str:
    """e.g. 1000 + 12 of the chat template + 1 more on the server's count."""
    return (f"{prompt}" + (f" + {template} of the chat template" if template else "")
            + (f" + {more} more on the server's count" if more else ""))
