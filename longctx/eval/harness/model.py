"""A longctx model as an lm-evaluation-harness model (`lm_eval.api.model.LM`).

    from lm_eval import simple_evaluate
    from longctx.eval.harness.model import LongctxLM

    lm = LongctxLM.from_pretrained("runs/x/hf", dtype="fp32")       # or LongctxLM(model, tokenizer)
    out = simple_evaluate(model=lm, tasks=["hellaswag"], limit=100)
    simple_evaluate(model="longctx", model_args="pretrained=runs/x/hf,dtype=bf16", tasks=[...])  # by name

- loglikelihood / loglikelihood_rolling: lm-eval's tokenization of (context, continuation) and
  its rolling windows (lm_eval's TemplateLM and utils), scored by eval/harness/loglik.py: the
  chunked loss, no full logits; rows batched longest first.
- generate_until: greedy decoding with longctx's KV cache (eval/runner.Engine), stopping at the
  model's stop ids or once the text holds one of the request's stop strings, the text cut at
  them as lm-eval's `hf` model cuts it;
  a request that asks for sampling is refused.
- apply_chat_template: the tokenizer's own jinja template (chat_template.jinja or
  tokenizer_config.json), rendered as transformers renders it.
- With `cp_group` (every rank of the group passes the same requests: lm-eval sees one process)
  prefill runs context-parallel: the same zigzag shards as `longctx eval --cp`.

Every answer goes to lm-eval's cache hook as it is computed, so with `use_cache` a stopped run
continues from the finished requests. `stop` (a PreemptionFlag, or anything with a collective
agreed()) is asked between batches; when it agrees, Stopped is raised.
"""
from __future__ import annotations

import json
from typing import Optional

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string

from longctx.base.errors import UserError
from longctx.data.tokenizer import prepends_bos
from longctx.eval.chat import own_template, render_conversation, special_tokens, stop_ids, tokenizer_dir
from longctx.eval.harness.loglik import batches, score_rows
from longctx.eval.runner import Engine

DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's default for a task that sets no max_gen_toks


class Stopped(Exception):
    """A stop (SIGTERM / SIGUSR1) ended the requests after a batch; the cache holds the finished ones."""


@register_model("longctx")
class LongctxLM(TemplateLM):
    """lm-eval's model interface over a longctx model and tokenizer (see the module docstring)."""

    def __init__(self, model, tokenizer, *, cp_group=None, cp_impl: str = "ring", batch_size: Optional[int] = None,
                 max_batch_tokens: int = 16384, max_length: Optional[int] = None, add_bos_token: Optional[bool] = None,
                 stop_token_ids=None, max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, stop=None) -> None:
        super().__init__()
        self.model, self.tokenizer = model, tokenizer
        self.cp_group, self.cp_impl, self.stop = cp_group, cp_impl, stop
        self.batch_size, self.max_batch_tokens, self.max_gen_toks = batch_size, max_batch_tokens, max_gen_toks
        self._max_length = max_length or model.config.max_position_embeddings
        self.add_bos = prepends_bos(tokenizer) if add_bos_token is None else bool(add_bos_token)
        directory = tokenizer_dir(getattr(tokenizer, "source", None))
        self._template, self._template_file = own_template(directory)
        self._specials = special_tokens(directory)
        stops = [tokenizer.eos_id] if getattr(tokenizer, "eos_id", None) is not None else []
        self.engine = Engine(model, tokenizer, cp_group=cp_group, cp_impl=cp_impl,
                             stop_ids=list(stop_token_ids) if stop_token_ids is not None else stops)

    @classmethod
    def from_pretrained(cls, pretrained: str, *, tokenizer: Optional[str] = None, dtype: str = "auto",
                        device: str = "auto", **kwargs) -> LongctxLM:
        """A model directory, checkpoint, run directory or Hub id, loaded as `longctx eval` loads it."""
        from longctx.eval.model_io import (
            eval_device,
            load_model,
            load_tokenizer_for,
            parse_dtype,
            resolve_model_dir,
        )

        model_dir = resolve_model_dir(pretrained, None)
        tok = load_tokenizer_for(model_dir, tokenizer)
        model = load_model(model_dir, dtype=parse_dtype(dtype)).eval().to(eval_device(device, 0))
        kwargs.setdefault("stop_token_ids", stop_ids(model_dir, tokenizer_dir(getattr(tok, "source", None)), tok))
        return cls(model, tok, **kwargs)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> LongctxLM:
        """`--model longctx --model_args pretrained=DIR,dtype=fp32,batch_size=4` (lm-eval's command line)."""
        args = simple_parse_args_string(arg_string)
        extra = {k: v for k, v in (additional_config or {}).items() if k == "batch_size" and v not in (None, "auto")}
        return cls.from_pretrained(**{**args, **extra})

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: Optional[dict] = None) -> LongctxLM:
        return cls.create_from_arg_string(",".join(f"{k}={v}" for k, v in arg_dict.items()), additional_config)

    # what lm-eval reads of a model
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context is scored after: BOS, else EOS (as lm-eval's hf model)."""
        bos = getattr(self.tokenizer, "bos_id", None)
        return bos if bos is not None else self.eot_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name", "tokenizer")).replace("/", "__")

    def chat_template(self, chat_template=False) -> Optional[str]:
        return self._template if chat_template is not False else None

    def apply_chat_template(self, chat_history: list, add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise UserError("lm_eval: apply_chat_template needs the tokenizer's own chat template (chat_template.jinja "
                            "or tokenizer_config.json's \"chat_template\"); the tokenizer has none")
        return render_conversation(self._template, self._specials, chat_history, self._template_file,
                                   add_generation_prompt=add_generation_prompt)

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, left_truncate_len=None,
                   **kwargs) -> list[int]:
        add = self.add_bos if add_special_tokens is None else bool(add_special_tokens)
        bos_text = self._specials.get("bos_token")
        if add_special_tokens is None and bos_text and string.startswith(bos_text):
            add = False  # a rendered chat template that starts with the BOS text already
        ids = self.tokenizer.encode(string, add_bos=add and getattr(self.tokenizer, "bos_id", None) is not None)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens)

    # the requests
    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.agreed():
            raise Stopped()

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """requests: ((context, continuation) or None, context ids, continuation ids); lm-eval's
        `hf` model's truncation: the last max_length + 1 tokens, the last one not read."""
        rows = []
        for _, context, continuation in requests:
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            rows.append((whole[:-1], list(continuation)))
        out: list = [None] * len(rows)
        for batch in batches([len(r[0]) for r in rows], self.max_batch_tokens, self.batch_size):
            scored = score_rows(self.model, [rows[i] for i in batch], pad_id=self._pad_id, cp_group=self.cp_group,
                                cp_impl=self.cp_impl)
            for i, answer in zip(batch, scored):
                out[i] = answer
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answer)
            self._check_stop()
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The whole text's log-likelihood: lm-eval's disjoint rolling windows of max_length tokens."""
        out = []
        for req in requests:
            (text,) = req.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                context_len=1)]
            total = sum(ll for ll, _ in self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows]))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out: list = [None] * len(requests)
        for key, members in groups.items():
            kwargs = normalize_gen_kwargs(dict(json.loads(key)), self.max_gen_toks)
            if kwargs.get("do_sample"):
                raise UserError(f"lm_eval: a task asks for sampling ({key}); longctx decodes greedily: pass "
                                "gen_kwargs=do_sample=false in --lm-eval-args")
            until = handle_stop_sequences(kwargs.get("until"), eos=self._specials.get("eos_token"))
            budget = int(kwargs["max_gen_toks"])
            if budget >= self.max_length:
                raise UserError(f"lm_eval: max_gen_toks {budget} leaves no room for a prompt in max_length "
                                f"{self.max_length}")
            prompts = {i: self.tok_encode(requests[i].args[0], left_truncate_len=self.max_length - budget)
                       for i in members}
            for batch in batches([len(prompts[i]) for i in members], self.max_batch_tokens, self.batch_size):
                ids = [members[j] for j in batch]
                generated = self.engine.generate_ids([prompts[i] for i in ids], budget, stopped=self._has_stop(until))
                for i, new in zip(ids, generated):
                    out[i] = postprocess_generated_text(self.tok_decode(new), until, None)
                    self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
                self._check_stop()
        return out

    def _has_stop(self, until: list[str]):
        """A row is done once its text holds a stop string: lm-eval cuts it there, so the tokens
        after it would be decoded for nothing (a long answer budget, a short answer)."""
        if not until:
            return None
        return lambda ids: any(stop in self.tok_decode(ids) for stop in until)

    @property
    def _pad_id(self) -> int:
        pad = getattr(self.tokenizer, "pad_id", None)
        return 0 if pad is None else pad

