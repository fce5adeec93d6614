"""The fields of `longctx eval`'s configuration: names, types, defaults and help, nothing else.

Kept apart from their validation (eval/config.py's EvalConfig, which imports the tasks, the
tokenizers and torch) so the command line builds its flags, and `longctx eval --help`, from
this module alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from longctx.eval.scoring import DEFAULT_THRESHOLD
from longctx.parallel.timeout_values import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_TIMEOUT_S

TOKENIZER_FIELD = "eval.tokenizer"  # the field tokenizer errors name in an evaluation


def option(default, help_text: str):
    """A field with its command-line help (commands/eval.py makes a flag of every field)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help_text})
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata={"help": help_text})
    return field(default=default, metadata={"help": help_text})


@dataclass
class EvalFields:
    """Every option of `longctx eval`, its default and its help; EvalConfig (eval/config.py) adds the checks."""

    model: Optional[str] = option(None, "HF directory, training checkpoint, run directory or Hub id org/name "
                                        "(required)")
    revision: Optional[str] = option(None, "Hub revision of --model when it is a Hub id (branch, tag or commit)")
    tokenizer: Optional[str] = option(None, "'byte', tokenizer.json or tokenizer dir (default: the model's own)")
    suite: List[str] = option(["ruler"], "suites: ruler, niah, passkey, ppl, none (only --lm-eval / --mrcr)")
    tasks: Optional[List[str]] = option(None, "task names (replaces the suite's tasks)")
    lengths: Optional[List[str]] = option(None, "context lengths, e.g. 4096,8k,16k (default 4096; with ruler_data: "
                                                "the data's)")
    samples: int = option(10, "samples per task and length (per depth for grids)")
    out: Optional[str] = option("eval_out", "output directory (null: write nothing)")
    seed: int = option(0, "data seed")
    mode: str = option("generate", "generate (greedy decoding with the KV cache) | teacher_forced (one forward of "
                                   "prompt + reference answer, right when every answer token is the argmax)")
    dtype: str = option("auto", "auto (as stored) | fp32 | bf16 | fp16")
    device: str = option("auto", "auto (this rank's GPU when CUDA is available, else the CPU) | cpu | cuda")
    batch_size: Optional[int] = option(None, "fixed decoding batch size (default: from max_batch_tokens)")
    max_batch_tokens: int = option(16384, "prompt tokens per batch when batch_size is unset")
    cp: int = option(1, "context-parallel size for prefill/decoding (under torchrun)")
    cp_impl: str = option("ring", "ring | allgather | ulysses")
    timeout_s: float = option(DEFAULT_TIMEOUT_S, "under torchrun: seconds a collective waits for a stalled rank "
                                                 "once the first batch is done (then exit 86; docs/operations.md)")
    startup_timeout_s: float = option(DEFAULT_STARTUP_TIMEOUT_S, "the same limit until the first batch is done")
    depths: Optional[List[str]] = option(None, "needle depths in [0,1] for grids (default 11 points)")
    style: str = option("ruler", "ruler (RULER's templates and budgets) | compact (tiny models, short lengths)")
    max_new_tokens: Optional[int] = option(None, "override every task's generation budget")
    num_digits: Optional[int] = option(None, "digits of numeric needle values and pass keys")
    chat_template: Optional[str] = option(None, "auto (the tokenizer's own; the default when it has one) | none | "
                                                "llama2-chat | llama3-chat | chatml | a string with {input}")
    thinking: bool = option(False, "render the tokenizer's template with enable_thinking (Qwen3); false: an empty "
                                   "think block, the answer at once, within the tasks' budgets")
    essay: Optional[str] = option(None, "local text corpus (file or folder) for the essay haystack")
    squad: Optional[str] = option(None, "local SQuAD v2 dev json for qa_1")
    hotpotqa: Optional[str] = option(None, "local HotpotQA dev (distractor) json for qa_2")
    ppl_data: Optional[str] = option(None, "long documents for perplexity (file or folder of .txt/.jsonl)")
    ppl_lengths: Optional[List[str]] = option(None, "lengths for perplexity (default: lengths)")
    ppl_windows: int = option(4, "windows per length for perplexity")
    threshold: float = option(DEFAULT_THRESHOLD, "effective-length threshold")
    strict_lengths: bool = option(False, "error (instead of warn) on lengths above max_position_embeddings")
    save_inputs: bool = option(False, "keep each prompt in results.json")
    no_progress: bool = option(False, "no progress bars")
    ruler_data: Optional[str] = option(None, "a RULER prepared-data directory to evaluate")
    write_data: Optional[str] = option(None, "write our prompts in RULER's data layout (no model needed)")
    words: Optional[str] = option(None, "RULER's english_words.json (cwe)")
    wandb_project: Optional[str] = option(None, "log the results to this W&B project as a table (needs wandb)")
    wandb_entity: Optional[str] = option(None, "W&B entity (default: the logged-in user's)")
    wandb_name: Optional[str] = option(None, "W&B run name (default: --out's name)")
    wandb_mode: str = option("online", "online | offline (W&B files under --out/wandb, uploaded by `wandb sync`)")
    endpoint: Optional[str] = option(None, "an OpenAI-compatible server's base URL (http://host:8000/v1: vLLM, SGLang, "
                                           "TGI, llama.cpp, transformers serve) to evaluate instead of --model; "
                                           "needs --tokenizer")
    served_model: Optional[str] = option(None, "the model name the endpoint serves (default: the one it lists)")
    endpoint_mode: str = option("completions", "completions (our prompt text, chat template applied here) | chat "
                                               "(messages, the server's own template)")
    concurrency: int = option(8, "requests to the endpoint in flight at once")
    request_timeout_s: float = option(600.0, "seconds one request to the endpoint may take")
    retries: int = option(5, "retries of a request that failed with 429, 5xx, a timeout or a lost connection "
                             "(exponential backoff); then the eval stops, its finished cells kept")
    api_key_env: str = option("OPENAI_API_KEY", "environment variable holding the endpoint's API key (sent as a "
                                                "bearer token when set; never logged or written)")
    lm_eval: Optional[List[str]] = option(None, "lm-evaluation-harness tasks or groups to run on the model too, e.g. "
                                                "hellaswag,arc_easy (needs longctx[eval]; --suite none: these only)")
    lm_eval_args: Optional[str] = option(None, "lm-eval options as key=value,... or JSON: num_fewshot, limit, "
                                               "apply_chat_template, fewshot_as_multiturn, gen_kwargs, include_path "
                                               "(a folder of local task YAMLs), bootstrap_iters, system_instruction, "
                                               "max_gen_toks, add_bos_token, max_length")
    mrcr: Optional[str] = option(None, "MRCR (OpenAI's multi-round co-reference set): a local .parquet/.jsonl/.json "
                                       "file or folder in the set's columns, or a Hub id (openai/mrcr)")
    mrcr_samples: Optional[int] = option(None, "MRCR: the first N rows only (default: all)")
    compare: Optional[str] = option(None, "the base model's results.json (or its eval directory): pair every task's "
                                          "samples with it and report the differences; exit 4 when a gated task "
                                          "regresses (docs/eval.md)")
    gate_threshold: float = option(1.0, "with --compare: points (0-100) a gated task may lose; it regresses when the "
                                        "drop exceeds this and its 95 percent paired interval lies below 0")
    gate_tasks: Optional[List[str]] = option(None, "with --compare: the lm-eval tasks or groups the gate judges "
                                                   "(default: every lm-eval task both results hold)")
    # a mapping: set as key=value only (model_overrides.max_position_embeddings=32768), no flag
    model_overrides: Dict[str, Any] = option({}, "ModelConfig fields replaced at eval time (zero-shot RoPE)")
