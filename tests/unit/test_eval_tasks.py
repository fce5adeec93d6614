"""Task generators: oracle/wrong scoring, length fitting, depth, answers, determinism, errors."""
import json
import re

import pytest

from longctx.base.errors import UserError
from longctx.data.tokenizer import load_tokenizer
from longctx.eval.haystack import NOISE
from longctx.eval.scoring import score_sample
from longctx.eval.tasks import RULER_TASKS, TASKS, TaskOptions, build_samples, get_task, task_min_length

BYTE = load_tokenizer("byte")
ALL_TASKS = list(TASKS)


@pytest.fixture(scope="module")
def qa_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    squad = {"version": "v2.0", "data": [
        {"title": t, "paragraphs": [
            {"context": f"The {t} paragraph {i} says that the {t} river is {i * 7 + 3} miles long and flows north.",
             "qas": [{"question": f"How long is the {t} river according to paragraph {i}?", "is_impossible": False,
                      "answers": [{"text": f"{i * 7 + 3} miles", "answer_start": 0}]},
                     {"question": "Unanswerable?", "is_impossible": True, "answers": []}]}
            for i in range(4)]}
        for t in [f"Name{j}" for j in range(60)]]}
    hotpot = [{"_id": str(k), "question": f"Which city hosts the {k}th festival of lanterns?",
               "answer": f"Lanternville-{k}", "type": "bridge", "level": "easy",
               "context": [[f"Festival {k}", [f"The {k}th festival of lanterns is held in Lanternville-{k}. ",
                                              "It draws many visitors."]],
                           [f"Town {k}", [f"Town {k} is a quiet place with {k} bakeries."]]]}
              for k in range(1, 200)]
    (d / "squad.json").write_text(json.dumps(squad))
    (d / "hotpot.json").write_text(json.dumps(hotpot))
    return TaskOptions(squad_path=str(d / "squad.json"), hotpotqa_path=str(d / "hotpot.json"))


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    """A small byte-level BPE trained here, loaded through the data package's loader."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from longctx.eval.haystack import BUILTIN_ESSAY, SINGLE_WORDS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = [BUILTIN_ESSAY, NOISE * 5, " ".join(SINGLE_WORDS), "One of the special magic numbers for x is: 1234567."]
    tok.train_from_iterator(corpus * 3, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    loaded = load_tokenizer(str(path))
    assert loaded.bos_id is not None
    return loaded


def _oracle(sample):
    return ", ".join(sample.outputs)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_oracle_scores_100_and_constant_wrong_scores_0(name, qa_files):
    samples = build_samples(name, BYTE, 2048, 3, seed=0, options=qa_files)
    assert len(samples) == 3
    assert all(score_sample(s.metric, _oracle(s), s.outputs) == 100.0 for s in samples)
    assert all(score_sample(s.metric, "I do not know.", s.outputs) == 0.0 for s in samples)
    # a realistic partial answer for multi-answer tasks gets partial credit (string_match_all)
    s = samples[0]
    if len(s.outputs) > 1 and s.metric == "string_match_all":
        assert 0.0 < score_sample(s.metric, s.outputs[0], s.outputs) < 100.0


def _shortest(tok, sample, length):
    """1% below the target; RULER's needle-only haystack (niah_multikey_2/3, no filler) may end
    up to one distractor needle short, as RULER's does."""
    if sample.meta.get("haystack") != "needle":
        return 0.99 * length
    needles = [x for x in sample.input.split("\n") if x.startswith("One of the special magic")]
    return min(0.99 * length, length - max(len(tok.encode(x + "\n")) for x in needles))


@pytest.mark.parametrize("length", [2048, 8192])
@pytest.mark.parametrize("name", ALL_TASKS)
def test_byte_tokenizer_lengths_hit_target_within_1pct(name, length, qa_files):
    samples = build_samples(name, BYTE, length, 2, seed=1, options=qa_files)
    for s in samples:
        n = len(BYTE.encode(s.prompt, add_bos=True))
        assert n == s.prompt_tokens
        assert _shortest(BYTE, s, length) <= s.length <= length, (s.length, length)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_hf_tokenizer_lengths_hit_target_within_1pct(name, hf_tok, qa_files):
    length = 4096
    samples = build_samples(name, hf_tok, length, 2, seed=2, options=qa_files)
    for s in samples:
        assert len(hf_tok.encode(s.prompt, add_bos=True)) == s.prompt_tokens
        assert _shortest(hf_tok, s, length) <= s.length <= length, (s.length, length)


def test_ruler_budgets_and_metrics():
    expected = {"niah_single_1": 128, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32, "qa_2": 32}
    for name, budget in expected.items():
        assert get_task(name).max_new_tokens(BYTE, TaskOptions()) == budget
    assert {get_task(n).metric for n in RULER_TASKS if n.startswith("qa")} == {"string_match_part"}
    assert {get_task(n).metric for n in RULER_TASKS if not n.startswith("qa")} == {"string_match_all"}
    assert len(RULER_TASKS) == 13


def _needle_token_fraction(tok, sample, needle_start_text, context_start, context_end):
    inp = sample.input
    pos = inp.index(needle_start_text)
    a = len(tok.encode(inp[:context_start]))
    b = len(tok.encode(inp[:context_end]))
    p = len(tok.encode(inp[:pos]))
    return (p - a) / (b - a)


@pytest.mark.parametrize("name", ["niah_single_1", "niah_single_2", "niah_multikey_2", "passkey"])
@pytest.mark.parametrize("tokname", ["byte", "hf"])
def test_needle_depth_placement(name, tokname, hf_tok):
    tok = BYTE if tokname == "byte" else hf_tok
    depths = [0.0, 0.25, 0.5, 0.75, 1.0]
    samples = build_samples(name, tok, 8192, 1, seed=3, depths=depths)
    assert [s.depth for s in samples] == depths
    for s in samples:
        value = s.outputs[0]
        if name == "passkey":
            start = s.input.index("\n") + 1  # after the preamble
            end = s.input.rindex("\nWhat is the pass key?")
            needle = f"The pass key is {value}."
        else:
            start = s.input.index("\n") + 1
            end = s.input.rindex("\nWhat ")
            needle = re.search(r"One of the special magic \w+ for [^:]+ is: " + re.escape(value), s.input).group(0)
        frac = _needle_token_fraction(tok, s, needle, start, end)
        assert abs(frac - s.depth) < 0.03, (name, s.depth, frac)


def _question(sample):
    return sample.input[sample.input.rindex("\nWhat "):] + sample.answer_prefix


@pytest.mark.parametrize("name", [n for n in ALL_TASKS if n.startswith("niah")])
def test_answers_present_in_needles_for_the_queried_keys(name):
    for s in build_samples(name, BYTE, 4096, 3, seed=4):
        q = _question(s)
        for value in s.outputs:
            m = re.findall(r"One of the special magic \w+ for (\S+) is: " + re.escape(value) + r"\.", s.input)
            assert len(m) == 1, (name, value)
            assert m[0] in q  # the needle's key is one that the question asks about
            # no other needle (distractors included) uses the queried key
            per_key = len(s.outputs) // len(set(re.findall(
                r"for (\S+) is: (?:" + "|".join(map(re.escape, s.outputs)) + ")", s.input)))
            assert s.input.count(f"for {m[0]} is:") == per_key


def test_other_tasks_answers_present(qa_files):
    vt = build_samples("vt", BYTE, 4096, 2, seed=5)[0]
    chain = vt.input.split("Memorize and track")[-1]  # after the one-shot example
    assert f"VAR {vt.outputs[0]} = " in chain
    for a, b in zip(vt.outputs, vt.outputs[1:]):
        assert f"VAR {b} = VAR {a}" in chain
    cwe = build_samples("cwe", BYTE, 8192, 1, seed=5)[0]
    listing = cwe.input.split("\n")[-2]  # the numbered list of the real question
    counts = {}
    for w in re.findall(r"\d+\. (\S+)", listing):
        counts[w] = counts.get(w, 0) + 1
    top = sorted(counts, key=counts.get, reverse=True)[:10]
    assert set(top) == set(cwe.outputs)
    assert min(counts[w] for w in cwe.outputs) > max(c for w, c in counts.items() if w not in cwe.outputs)
    fwe = build_samples("fwe", BYTE, 8192, 1, seed=5)[0]
    words = fwe.input.split("coded words. ")[1].split("\nQuestion:")[0].split()
    freq = {}
    for w in words:
        freq[w] = freq.get(w, 0) + 1
    ranked = sorted((w for w in freq if w != "..."), key=freq.get, reverse=True)
    assert ranked[:3] == fwe.outputs
    assert freq[ranked[2]] > freq[ranked[3]]
    for s in build_samples("qa_1", BYTE, 2048, 3, seed=5, options=qa_files):
        assert any(o in s.input for o in s.outputs)  # SQuAD answers are spans of the gold paragraph
    for s in build_samples("qa_2", BYTE, 2048, 3, seed=5, options=qa_files):
        assert s.outputs[0] in s.input


def test_deterministic_by_seed(hf_tok):
    for name in ["niah_multikey_2", "niah_multiquery", "vt", "cwe", "fwe", "passkey"]:
        a = build_samples(name, BYTE, 2048, 2, seed=11)
        b = build_samples(name, BYTE, 2048, 2, seed=11)
        c = build_samples(name, BYTE, 2048, 2, seed=12)
        assert [s.prompt for s in a] == [s.prompt for s in b]
        assert [s.prompt for s in a] != [s.prompt for s in c]
    # a rank's share equals the same indices of the full set
    full = build_samples("niah_single_2", BYTE, 2048, 4, seed=3, depths=[0.1, 0.9])
    part = build_samples("niah_single_2", BYTE, 2048, 4, seed=3, depths=[0.1, 0.9], indices=[1, 6])
    assert [s.prompt for s in part] == [full[1].prompt, full[6].prompt]


def test_compact_style_fits_tiny_lengths_for_the_demo():
    opts = TaskOptions(style="compact")
    for name in ["niah_single_1", "niah_single_2", "niah_multikey_2", "passkey"]:
        for length in (256, 512):
            for s in build_samples(name, BYTE, length, 2, seed=0, options=opts):
                assert 0.95 * length <= s.length <= length  # one word is ~3% of 256 bytes
                assert s.stop == ["\n"] and s.max_new_tokens <= 16
    assert task_min_length("niah_multikey_2", BYTE, opts) < 256


def test_bad_inputs_give_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="unknown task 'niah_single_9'"):
        get_task("niah_single_9")
    with pytest.raises(UserError, match=r"300 is below the minimum of task niah_multivalue \(\d+ tokens"):
        build_samples("niah_multivalue", BYTE, 300, 1)
    with pytest.raises(UserError, match="qa_1 skipped: no squad file given"):
        build_samples("qa_1", BYTE, 2048, 1)
    with pytest.raises(UserError, match="not found"):
        build_samples("qa_2", BYTE, 2048, 1, options=TaskOptions(hotpotqa_path=str(tmp_path / "nope.json")))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"title": "x"}]}))
    with pytest.raises(UserError, match="not in SQuAD format"):
        build_samples("qa_1", BYTE, 2048, 1, options=TaskOptions(squad_path=str(bad)))
    with pytest.raises(UserError, match="style"):
        TaskOptions(style="tiny")
    with pytest.raises(UserError, match="depths"):
        build_samples("passkey", BYTE, 2048, 1, depths=[1.5])
    with pytest.raises(UserError, match="chat_template"):
        TaskOptions(chat_template="no placeholder")


def test_essay_corpus_from_local_path_and_chat_template(tmp_path):
    corpus = tmp_path / "essays"
    corpus.mkdir()
    (corpus / "a.txt").write_text("Zebras graze quietly near the lake. " * 200)
    opts = TaskOptions(essay_path=str(corpus), chat_template="llama2-chat")
    s = build_samples("niah_single_2", BYTE, 4096, 1, options=opts)[0]
    assert "Zebras graze quietly" in s.input
    assert s.prompt.startswith("[INST] ") and " [/INST]" + s.answer_prefix in s.prompt
    assert len(BYTE.encode(s.prompt, add_bos=True)) == s.prompt_tokens <= 4096 - 128
    with pytest.raises(UserError, match="no such file"):
        build_samples("niah_single_2", BYTE, 4096, 1, options=TaskOptions(essay_path=str(tmp_path / "missing")))
