"""Each template departure closed, checked against the format RULER's generators write
(scripts/data/synthetic/*.py and constants.py in github.com/NVIDIA/RULER)."""
import json
import re

import pytest

from longctx.base.errors import UserError
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.haystack import NOISE, SINGLE_WORDS
from longctx.eval.tasks import TaskOptions, build_samples

BYTE = load_tokenizer("byte")
NEEDLE = re.compile(r"One of the special magic (numbers|uuids) for \S+ is: \S+\.")
VT_TEMPLATE_START = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
VT_STATEMENT = re.compile(r"VAR [A-Z]{5} = (VAR [A-Z]{5} |\d{5})")


def _vt_parts(sample):
    """(one-shot example, the question's context lines) of a vt prompt."""
    example, _, task = sample.input.rpartition(VT_TEMPLATE_START)
    context = task.rsplit("\nQuestion: ", 1)[0]
    return example, context.split("\n")


def test_vt_statements_on_their_own_lines_between_noise_lines():
    s = build_samples("vt", BYTE, 4096, 1, seed=2)[0]
    _, lines = _vt_parts(s)
    statements = [x for x in lines if x.startswith("VAR ")]
    assert len(statements) == 5 and all(VT_STATEMENT.fullmatch(x) for x in statements)
    noise = [x for x in lines if not x.startswith("VAR ")]
    assert all(x == NOISE for x in noise[:-1]) and NOISE.startswith(noise[-1])  # the last one tops up
    assert "assigned the value" in s.answer_prefix and "assgined" not in s.prompt


def test_vt_one_shot_example_redrawn_per_sample_and_joined_as_ruler_joins_it():
    a, b = build_samples("vt", BYTE, 4096, 2, seed=2)
    ex_a, ex_b = _vt_parts(a)[0], _vt_parts(b)[0]
    for ex in (ex_a, ex_b):
        # RULER: example input (template + answer prefix) + " " + answers + "\n", then "\n" + the question
        assert ex.startswith(VT_TEMPLATE_START) and ex.endswith("\n\n")
        m = re.search(r"5 variables are assigned the value (\d{5}), they are:  ((?:[A-Z]{3} ){4}[A-Z]{3})\n\n$", ex)
        assert m and m.group(1) != "12345"
        names = m.group(2).split()
        assert f"VAR {names[0]} = {m.group(1)}" in ex
        assert all(f"VAR {y} = VAR {x} " in ex for x, y in zip(names, names[1:]))
        question = ex.rsplit(" Answer: According", 1)[0]
        assert len(BYTE.encode(question, add_bos=True)) <= 500  # RULER fits the example's question to 500
    # same layout (noise lines) with fresh names and value in every sample
    strip = lambda ex: re.sub(r"[A-Z]{3}\b|\d{5}", "#", ex)  # noqa: E731
    assert ex_a != ex_b and strip(ex_a) == strip(ex_b)


@pytest.mark.parametrize("name", ["niah_multikey_2", "niah_multikey_3"])
def test_multikey_2_3_haystack_is_distractor_needles_only(name):
    for s in build_samples(name, BYTE, 4096, 2, seed=0):
        context = s.input.split("afterwards.\n", 1)[1].rsplit("\nWhat is the special magic", 1)[0]
        lines = context.split("\n")
        assert len(lines) > 20 and all(NEEDLE.fullmatch(x) for x in lines), [
            x for x in lines if not NEEDLE.fullmatch(x)]
    # compact style (tiny models, the demo) tops the haystack up with noise words
    compact = build_samples("niah_multikey_2", BYTE, 512, 4, seed=0, options=TaskOptions(style="compact"))
    assert any(not NEEDLE.fullmatch(x) for s in compact for x in s.input.split("\n")[:-1])


def test_fwe_vocabulary_is_length_less_budget_over_50():
    for length in (2048, 8192):
        s = build_samples("fwe", BYTE, length, 1, seed=0)[0]
        assert s.meta["vocab_size"] == (length - 50) // 50
        text = s.input.split("coded words. ")[1].split("\nQuestion:")[0].split()
        assert len(set(text)) <= (length - 50) // 50


def test_cwe_example_in_its_own_chat_turn():
    s = build_samples("cwe", BYTE, 3072, 1, seed=0, options=TaskOptions(chat_template="llama2-chat"))[0]
    prefix = " Answer: The top 10 words that appear most often in the list are:"
    # RULER: each example is the whole templated prompt + answer prefix + " " + numbered answer, then "\n"
    turns = re.fullmatch(r"(\[INST\] Below is a numbered list.*? \[/INST\])" + re.escape(prefix)
                         + r" ((?:\d+\. \S+ ?){10})\n(\[INST\] Below is a numbered list.*? \[/INST\])"
                         + re.escape(prefix), s.prompt, flags=re.S)
    assert turns, s.prompt[:300]
    assert [w for w in re.findall(r"\d+\. (\S+)", turns.group(2))] != s.outputs
    assert len(BYTE.encode(s.prompt, add_bos=True)) == s.prompt_tokens
    # without a template the prompt reads as before: example, newline, question
    plain = build_samples("cwe", BYTE, 3072, 1, seed=0)[0]
    assert plain.prompt.count("Below is a numbered list") == 2 and "[INST]" not in plain.prompt


def test_cwe_words_file_gives_real_words_past_the_builtin_list(tmp_path):
    extra = [f"{w}{suffix}" for w in SINGLE_WORDS for suffix in ("s", "ed", "ing")]
    words = tmp_path / "english_words.json"  # RULER's layout: an object whose values are the words
    words.write_text(json.dumps({str(i): w for i, w in enumerate(extra)}))
    s = build_samples("cwe", BYTE, 65536, 1, seed=0, options=TaskOptions(words_path=str(words)))[0]
    listed = set(re.findall(r"\d+\. (\S+)", s.input))
    assert len(listed) > len(SINGLE_WORDS)
    assert listed <= set(SINGLE_WORDS) | set(extra)
    with pytest.raises(UserError, match="eval.words"):
        build_samples("cwe", BYTE, 4096, 1, options=TaskOptions(words_path=str(tmp_path / "none.json")))
