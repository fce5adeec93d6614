"""The local lm-eval tasks of tests/data/lm_eval (a task YAML over a small JSON file each; the
machines have no dataset hub) and a tiny exported model with an HF tokenizer both backends load."""
import json
from pathlib import Path

import longctx
from helpers.byte_level_files import write_byte_level_tokenizer
from helpers.model import perturb_norms_and_biases
from longctx.model import build_model, get_preset

DATA = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
TASKS = ("lc_choice", "lc_gen", "lc_rolling")
# a chatml template, as SmolLM2-Instruct's
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_tasks(d: Path) -> Path:
    """The task YAMLs in `d`, pointing at the JSON files in the repository; returns `d` (include_path)."""
    d.mkdir(parents=True, exist_ok=True)
    for name in TASKS:
        text = (DATA / f"{name}.yaml").read_text().replace("{data_dir}", str(DATA))
        (d / f"{name}.yaml").write_text(text)
    return d


def write_model(d: Path, seed: int = 1, max_position_embeddings: int = 1024) -> Path:
    """debug-tiny (fp32) exported to `d` with a byte-level tokenizer.json, a chat template and no
    automatic BOS (the same for lm-eval's `hf` model and longctx)."""
    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=max_position_embeddings)
    longctx.save_pretrained(perturb_norms_and_biases(build_model(cfg, seed=seed), seed + 1).eval(), d)
    write_byte_level_tokenizer(d, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    (d / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": TEMPLATE}))
    return d
