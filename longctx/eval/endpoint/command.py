"""`longctx eval --endpoint URL`: the evaluation of a served model, from the command line's config.

    result = run_endpoint(cfg, flag, overwrite=False)   # an EvalResult; as eval/command.py's in process

In order: the tokenizer; the server's answers (eval/endpoint/server.py: reachable, the model
listed, its limits, our tokenizer against its own where it says), the samples and cells, every
prompt against the server's limits as it counts them (eval/endpoint/lengths.py) -- all before
--out is made or any prompt is sent; then --out's lock, the cells it already holds, and the
cells run through the backend, N requests at a time (a failed request ends the eval with the
finished samples kept: eval/endpoint/backend.py). A cell's key holds the endpoint, the served
model and the mode (with the tokenizer, the samples and longctx's version), so a rerun
continues and another server's cells are refused.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Iterator, Optional

from longctx import __version__
from longctx.base.errors import UserError
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.api import evaluate, out_lock
from longctx.eval.cells import tokenizer_files
from longctx.eval.chat import ChatChoice
from longctx.eval.config import TOKENIZER_FIELD, EvalConfig
from longctx.eval.endpoint.backend import EndpointBackend
from longctx.eval.endpoint.client import EndpointClient
from longctx.eval.endpoint.lengths import check_lengths
from longctx.eval.endpoint.server import ServerInfo, probe
from longctx.eval.prepare import attach_store, prepare
from longctx.eval.state import EvalContext, EvalResult

SERVER_TEMPLATE = {"choice": "server", "source": "the server's own chat template (endpoint_mode chat)"}


def endpoint_identity(info: ServerInfo, mode: str, tokenizer_spec: str) -> dict:
    """What every cell of a served evaluation shares: the endpoint and served model (in place of
    the model's files), the tokenizer's files, the mode and longctx's version."""
    return {"model": {"endpoint": info.url, "served_model": info.model}, "tokenizer": tokenizer_files(tokenizer_spec),
            "dtype": "served", "longctx": __version__, "endpoint_mode": mode}


def run_endpoint(cfg: EvalConfig, stop, *, overwrite: bool = False) -> EvalResult:
    """Evaluate cfg.endpoint's model (cfg passed validate); UserError before any prompt is sent."""
    tokenizer = load_tokenizer(cfg.tokenizer, field=TOKENIZER_FIELD)
    client = EndpointClient(cfg.endpoint, api_key=_api_key(cfg.api_key_env),
                            timeout_s=cfg.request_timeout_s, retries=cfg.retries, concurrency=cfg.concurrency)
    try:
        info = probe(client, cfg.served_model, tokenizer, str(cfg.tokenizer), cfg.endpoint_mode)
        chat = cfg.endpoint_mode == "chat"
        run_cfg = dataclasses.replace(cfg, chat_template="none") if chat and cfg.ruler_data is None else cfg
        plan = prepare(run_cfg, tokenizer)
        if chat:
            plan.chat = ChatChoice(None, dict(SERVER_TEMPLATE))
        notes: list[str] = []

        def warn(note: str) -> None:  # printed at once: a refusal that follows may be its consequence
            print(f"warning: {note}", file=sys.stderr)
            notes.append(note)

        for note in _limit_notes(info):
            warn(note)
        check_lengths(client, info, plan.samples, tokenizer, add_bos=plan.run.options.add_bos,
                      mode=cfg.endpoint_mode, tokenizer_name=str(cfg.tokenizer), warn=warn)
        backend = EndpointBackend(client, info.model, mode=cfg.endpoint_mode, concurrency=cfg.concurrency)
        with out_lock(cfg.out):
            if cfg.out is not None:
                attach_store(plan, cfg.out, endpoint_identity(info, cfg.endpoint_mode, str(cfg.tokenizer)),
                             f"{info.model} at {info.url}", overwrite=overwrite)
            context = EvalContext(meta=_meta(cfg, info, tokenizer, plan.run), warnings=notes)
            result = evaluate(None, tokenizer, run_cfg, context=context, stop=stop, plan=plan, backend=backend)
    finally:
        client.close()
    if result.preempted is not None and backend.failure is not None:
        result.preempted["failure"] = backend.failure
        result.preempted["refused"] = backend.refused
        result.preempted["broken"] = backend.broken
    return result


def _api_key(variable: str) -> Optional[str]:
    """The key in $variable (None when unset or empty); UserError, not naming it, for one no HTTP
    header can carry (httpx would refuse it with the key in its message)."""
    key = os.environ.get(variable) or None
    if key is not None and not (key.isascii() and key.isprintable() and key == key.strip()):
        raise UserError(f"eval.api_key_env: ${variable} holds characters an HTTP header cannot carry (a space or "
                        "newline at an end, a control character, non-ASCII); set it to the key alone")
    return key


@contextlib.contextmanager
def endpoint_chat(cfg: EvalConfig) -> Iterator[tuple]:
    """(a client, the server's ServerInfo, our tokenizer) for requests beyond the cells (MRCR's
    conversations, lm-eval's tasks), after the same checks (probe) as the cells' requests; the
    client closes on exit."""
    tokenizer = load_tokenizer(cfg.tokenizer, field=TOKENIZER_FIELD)
    client = EndpointClient(cfg.endpoint, api_key=_api_key(cfg.api_key_env),
                            timeout_s=cfg.request_timeout_s, retries=cfg.retries, concurrency=cfg.concurrency)
    try:
        info = probe(client, cfg.served_model, tokenizer, str(cfg.tokenizer), cfg.endpoint_mode)
        yield client, info, tokenizer
    finally:
        client.close()


def _limit_notes(info: ServerInfo) -> list[str]:
    if info.limit is not None:
        return []
    return [f"{info.url} publishes no context limit for {info.model}: prompts are not checked against it before "
            "they are sent (a prompt longer than it stops the eval when the server refuses it)"]


def _meta(cfg: EvalConfig, info: ServerInfo, tokenizer, selection) -> dict:
    """results.json's meta: the in-process fields (the server's limit as max_position_embeddings;
    what the server does not say is null) and the endpoint's."""
    suite = "ruler_data" if cfg.ruler_data is not None else ",".join(cfg.suite) if cfg.tasks is None else "tasks"
    return {"model": info.model, "tokenizer": getattr(tokenizer, "name", str(cfg.tokenizer)), "suite": suite,
            "cp": 1, "dtype": None, "max_position_embeddings": info.limit, "rope_parameters": None,
            "lengths": selection.lengths, "tasks": selection.tasks, "model_overrides": {},
            "endpoint": info.url, "served_model": info.model, "endpoint_mode": cfg.endpoint_mode,
            "server": info.record()}


def failure_line(result: EvalResult) -> Optional[str]:
    """The one line a served evaluation that stopped on a failed request ends with (None otherwise)."""
    info = result.preempted or {}
    if not info.get("failure"):
        return None
    where = f" in {info['out']}" if info.get("out") else " (no --out: nothing kept)"
    if info.get("refused"):
        again = "the server refuses the request: once that is fixed, the same command continues from them"
    elif info.get("broken"):
        again = ("the answer did not arrive whole (the server or a proxy between): once that is fixed, the same "
                 "command continues from them")
    else:
        again = "run the same command again once the server answers, it continues from them"
    return (f"error: the endpoint failed: {info['failure']}; stopped with {info['cells_done']} of {info['cells']} "
            f"cells done{where}; {again}")
