"""The model's own chat template and stop tokens.

    choice = resolve_chat_template_choice(cfg.chat_template, tokenizer_dir)  # before any weight
    choice.spec      # what TaskOptions.chat_template takes: a string with one "{input}", or None
    choice.record    # results.json's meta["chat_template"]
    ids = stop_ids(model_dir, tokenizer_dir, tokenizer)   # every end-of-sequence / end-of-turn id

`chat_template` unset (or "auto") takes the tokenizer's own template: chat_template.jinja, else
tokenizer_config.json's "chat_template" (its "default" entry when it is a list), rendered as
transformers' apply_chat_template renders it (a sandboxed jinja2 environment with trim_blocks
and lstrip_blocks, the special tokens as variables, one user message, add_generation_prompt).
The user message is a placeholder, so the rendering becomes a "{input}" template; a leading BOS
text is dropped when the runner adds the BOS id itself (the tokenizer's config does not set
add_bos_token false; SmolLM2's does, and its template's leading <|im_start|> stays). Unset with no template of its own:
no template. "none", a preset or a "{input}" string: as given. Qwen3's templates render with
enable_thinking=false unless eval.thinking is true.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError
from longctx.data.tokenizer import prepends_bos
from longctx.eval.tasks.base import CHAT_TEMPLATES

AUTO = "auto"
PLACEHOLDER = "\x00LONGCTX_INPUT\x00"  # no template produces it; it becomes "{input}"
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# end-of-turn tokens of common chat formats, stop ids when they are special tokens of the tokenizer
TURN_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<end_of_turn>",
               "</s>", "<eos>", "<|end|>")


@dataclass
class ChatChoice:
    spec: Optional[str]  # TaskOptions.chat_template: a preset name, a "{input}" string, or None
    record: dict = field(default_factory=dict)  # results.json: choice, source, template


def tokenizer_dir(spec: Optional[str]) -> Optional[Path]:
    """The directory of a tokenizer spec's files (None for "byte" and hub ids)."""
    if not spec or spec == "byte":
        return None
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    return path.parent if path.is_file() else None


def own_template(directory: Optional[Path]) -> tuple[Optional[str], Optional[str]]:
    """(the tokenizer's jinja template, the file it is in), or (None, None)."""
    if directory is None:
        return None, None
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8"), str(jinja)
    config = _tokenizer_config(directory)
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers uses "default"
        template = next((t.get("template") for t in template if isinstance(t, dict) and t.get("name") == "default"),
                        None)
    if isinstance(template, str) and template.strip():
        return template, str(directory / "tokenizer_config.json")
    return None, None


def _tokenizer_config(directory: Path) -> dict:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"eval.tokenizer: {path} is not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value) -> Optional[str]:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def special_tokens(directory: Optional[Path]) -> dict:
    """{bos_token: "<s>", ...}: the variables a template sees (special_tokens_map.json, then
    tokenizer_config.json, which wins, as transformers reads them)."""
    out: dict = {}
    if directory is None:
        return out
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        for key in _SPECIAL_KEYS:
            text = _token_text(data.get(key)) if isinstance(data, dict) else None
            if text is not None:
                out[key] = text
    return out


def render_conversation(source: str, specials: dict, messages: list, where: str, *,
                        add_generation_prompt: bool = True, thinking: bool = False) -> str:
    """A jinja chat template rendered for `messages` as transformers' apply_chat_template renders
    it (continue_final_message when no generation prompt is added, as lm-eval asks)."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        text = env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                              tools=None, documents=None, enable_thinking=thinking, **specials)
    except TemplateError as e:
        raise UserError(f"eval.chat_template: the tokenizer's template in {where} does not render ({e}); pass a "
                        f"preset ({', '.join(CHAT_TEMPLATES)}) or a string with {{input}}") from None
    if not add_generation_prompt and messages and messages[-1].get("content"):
        last = messages[-1]["content"]  # continue_final_message: the text ends with that message's content
        cut = text.rfind(last.strip())
        if cut >= 0:
            text = text[:cut + len(last.strip())]
    return text


def render(source: str, specials: dict, where: str, runner_adds_bos: bool = True, thinking: bool = False) -> str:
    """The template rendered for one user turn and the assistant's reply, with "{input}" for the turn.
    `thinking` is Qwen3's enable_thinking switch (templates without it ignore it): off by default,
    since a retrieval answer within RULER's few-token budgets leaves no room for a reasoning trace."""
    text = render_conversation(source, specials, [{"role": "user", "content": PLACEHOLDER}], where,
                               thinking=thinking)
    if text.count(PLACEHOLDER) != 1:
        raise UserError(f"eval.chat_template: the tokenizer's template in {where} does not place the user message "
                        "once; pass a preset or a string with {input}")
    bos = specials.get("bos_token")
    if runner_adds_bos and bos and text.startswith(bos):
        text = text[len(bos):]  # the runner adds the BOS id
    return text.replace(PLACEHOLDER, "{input}")


def resolve_chat_template_choice(value: Optional[str], directory: Optional[Path], *,
                                 ruler_data: bool = False, adds_bos: bool = True, thinking: bool = False) -> ChatChoice:
    """What eval.chat_template means for this tokenizer (see the module docstring)."""
    if value is None and ruler_data:
        return ChatChoice(None, {"choice": "ruler_data", "source": "RULER's prepared prompts"})
    if value not in (None, AUTO):
        name = value if value in CHAT_TEMPLATES else "custom"
        return ChatChoice(value, {"choice": name, "template": CHAT_TEMPLATES.get(value, value)})
    source, where = own_template(directory)
    if source is None:
        if value == AUTO:
            looked = f" in {directory}" if directory is not None else " (the tokenizer has no files)"
            raise UserError(f"eval.chat_template: auto needs the tokenizer's own template (chat_template.jinja or "
                            f"tokenizer_config.json's \"chat_template\"); none{looked}; pass none, a preset "
                            f"({', '.join(t for t in CHAT_TEMPLATES if t != 'none')}) or a string with {{input}}")
        return ChatChoice(None, {"choice": "none", "template": "{input}"})
    template = render(source, special_tokens(directory), where, runner_adds_bos=adds_bos, thinking=thinking)
    return ChatChoice(template, {"choice": AUTO, "source": where, "template": template, "enable_thinking": thinking})


def with_chat_template(cfg, tokenizer):
    """(the ChatChoice of an EvalConfig for this tokenizer, the config with chat_template resolved)."""
    choice = resolve_chat_template_choice(cfg.chat_template, tokenizer_dir(getattr(tokenizer, "source", None)),
                                          ruler_data=cfg.ruler_data is not None, adds_bos=prepends_bos(tokenizer),
                                          thinking=getattr(cfg, "thinking", False))
    return choice, dataclasses.replace(cfg, chat_template=choice.spec)


def _ids(value) -> list[int]:
    """config.json / generation_config.json's eos_token_id: an int, a list of ints, or absent."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stop_ids(model_dir: Optional[Path], directory: Optional[Path], tokenizer) -> list[int]:
    """Every id that ends a generation: the tokenizer's EOS, config.json's and
    generation_config.json's eos_token_id (an int or a list), and the tokenizer's special
    end-of-turn tokens (TURN_TOKENS); sorted, within the vocabulary."""
    ids = set()
    if getattr(tokenizer, "eos_id", None) is not None:
        ids.add(int(tokenizer.eos_id))
    for d in {p for p in (model_dir, directory) if p is not None}:
        for name in ("config.json", "generation_config.json"):
            ids.update(_ids(_json(d / name).get("eos_token_id")))
    backend = getattr(tokenizer, "backend", None)
    if backend is not None:
        for token_id, token in backend.get_added_tokens_decoder().items():
            if token.special and token.content in TURN_TOKENS:
                ids.add(int(token_id))
    vocab = getattr(tokenizer, "vocab_size", None)
    return sorted(i for i in ids if i >= 0 and (vocab is None or i < vocab))
