"""The built-in synthetic retrieval corpus."""
import re
from collections import Counter

import numpy as np
import pytest

from helpers.data import train_bpe
from longctx.base.errors import UserError
from longctx.data import (
    ByteTokenizer,
    DataConfig,
    SourceConfig,
    SyntheticConfig,
    SyntheticCorpus,
    build_loader,
    generate_document,
    load_tokenizer,
)
from longctx.data.filler import NOISE
from longctx.data.templates import TEMPLATES, min_document_chars
from longctx.data.words import WORD_PAIRS

TOK = ByteTokenizer()


def test_deterministic_and_seeded():
    cfg = SyntheticConfig()
    a = SyntheticCorpus(cfg, seq_len=256)
    b = SyntheticCorpus(SyntheticConfig(), seq_len=256)
    assert [a[i].text for i in range(20)] == [b[i].text for i in range(20)]
    c = SyntheticCorpus(SyntheticConfig(seed=99), seq_len=256)
    assert sum(a[i].text == c[i].text for i in range(20)) == 0
    assert len({a[i].text for i in range(200)}) == 200


@pytest.mark.parametrize("style", ["short", "compact", "ruler"])
def test_answers_needles_and_distractors(style):
    cfg = SyntheticConfig(style=style, num_keys=4, num_values=3)
    for i in range(60):
        task = ["niah", "multivalue", "passkey"][i % 3]
        d = generate_document(cfg, i, length_chars=1500, task=task, style=style)
        assert d.task == task and len(d.text) <= 1500 and len(d.text) >= 1500 - 40
        assert d.text == d.text[: d.prompt_len] + d.answer
        assert [d.text[s:e] for s, e in d.answer_spans] == d.values
        assert all(s >= d.prompt_len for s, _ in d.answer_spans)
        body = d.text[: d.prompt_len]
        for s, e in d.needle_spans:  # each queried needle states the key and a value
            needle = d.text[s:e]
            assert any(v in needle for v in d.values)
            if d.key:
                assert d.key in needle
        assert not re.search(r"\d", re.sub("|".join(re.escape(d.text[s:e]) for s, e in d.needle_spans)
                                           + r"|magic numbers? for [\w-]+ is:? \d+", "", body))
        if task == "passkey":
            assert len(d.values) == 1 and len(d.values[0]) == 5 and d.key is None
            continue
        assert len(d.keys) == 4 and len(set(d.keys)) == 4 and d.keys[0] == d.key
        assert len(d.values) == (3 if task == "multivalue" else 1)
        for k in d.keys[1:]:  # distractor needles: other keys with other values
            m = re.search(re.escape(k) + r" is:? (\d+)", body)
            assert m and m.group(1) not in d.values
        assert body.count(d.key) == len(d.values) + (1 if style != "short" else 0) + 1
        if style == "ruler":
            assert body.startswith(TEMPLATES["ruler"]["intro"][task])


def test_filler_kinds():
    noise = generate_document(SyntheticConfig(filler="noise"), 0, length_chars=800, task="passkey")
    assert NOISE.split(". ")[1] in noise.text
    varied = generate_document(SyntheticConfig(filler="varied"), 0, length_chars=800, task="passkey")
    assert "The grass is green" not in varied.text and len(set(varied.text.split())) > 40


def test_distance_control():
    for dist in (100, 600, 1200):
        cfg = SyntheticConfig(distance_min=dist, distance_max=dist, num_keys=3)
        for i in range(10):
            d = generate_document(cfg, i, length_chars=2000, task="niah")
            assert abs(d.distance - dist) <= 130, (dist, d.distance)  # snapped to a sentence start
    cfg = SyntheticConfig(distance_min=0, distance_max=50)
    far = SyntheticConfig(distance_min=1500, distance_max=1800)
    near_d = [generate_document(cfg, i, length_chars=2000, task="niah").distance for i in range(10)]
    far_d = [generate_document(far, i, length_chars=2000, task="niah").distance for i in range(10)]
    assert max(near_d) < 200 < 1300 < min(far_d)


def test_corpus_lengths_fit_rows_with_byte_and_bpe(tmp_path):
    corpus = SyntheticCorpus(SyntheticConfig(style="short"), seq_len=256)
    lens = [len(corpus[i].text) + 2 for i in range(300)]
    assert max(lens) <= 256 and min(lens) >= 100
    assert abs(np.mean(lens) - 192) < 20  # uniform over [seq_len/2, seq_len]
    tasks = Counter(corpus[i].task for i in range(300))
    assert abs(tasks["niah"] / 300 - 0.6) < 0.1 and abs(tasks["multivalue"] / 300 - 0.2) < 0.08
    bpe = load_tokenizer(train_bpe(tmp_path / "tok"))
    corpus = SyntheticCorpus(SyntheticConfig(style="compact"), seq_len=512, tokenizer=bpe)
    n = [len(bpe.encode(corpus[i].text)) + 2 for i in range(60)]
    assert max(n) <= 512 and np.mean(n) > 250


def test_min_document_chars_is_a_bound():
    cfg = SyntheticConfig(num_keys=1)
    for style in TEMPLATES:
        for task in ("niah", "multivalue", "passkey", "recall"):
            need = min_document_chars(cfg, task, style)
            for i in range(5):
                assert len(generate_document(cfg, i, length_chars=10, task=task, style=style).text) <= need


def test_loader_answer_mask_marks_exactly_the_answer_digits():
    cfg = DataConfig(seq_len=256, micro_batch_size=4, emit_answer_mask=True, prefetch=0,
                     sources=[SourceConfig(kind="synthetic", packing="pad", synthetic=SyntheticConfig(num_docs=40))])
    corpus = SyntheticCorpus(cfg.sources[0].synthetic, seq_len=256)
    want = Counter()
    for i in range(40):
        want.update("".join(corpus[i].values))
    got = Counter()
    for b in build_loader(DataConfig(**{**cfg.__dict__, "epochs": 1}), TOK, dp_rank=0, dp_size=1, seed=0):
        m = b["answer_mask"].numpy()
        got.update(bytes(b["labels"].numpy()[m].astype(np.uint8)).decode())
        # one document per row in "pad" mode: nothing is split
        assert ((b["input_ids"] == TOK.bos_id).sum(1) >= 1).all()
    assert got == want


def test_tasks_too_long_for_the_length_fall_back(caplog):
    corpus = SyntheticCorpus(SyntheticConfig(style="compact"), seq_len=256)  # multivalue needs ~264
    assert corpus.fallback == {"niah": "niah", "multivalue": "niah", "passkey": "passkey"}
    assert "too short for multivalue" in caplog.text
    tasks = Counter(corpus[i].task for i in range(300))
    assert set(tasks) == {"niah", "passkey"} and abs(tasks["niah"] / 300 - 0.8) < 0.1
    assert max(len(corpus[i].text) + 2 for i in range(300)) <= 256
    assert SyntheticCorpus(SyntheticConfig(style="compact"), seq_len=320).fallback["multivalue"] == "multivalue"


def test_length_min_ratio_fills_documents_with_distractors():
    """length_min_ratio near 1: every document close to seq_len, so a 256-token compact
    niah document always has room for a distractor needle (the demo's base training)."""
    corpus = SyntheticCorpus(SyntheticConfig(style="compact", filler="noise", length_min_ratio=0.95,
                                             tasks={"niah": 1.0}), seq_len=256)
    docs = [corpus[i] for i in range(100)]
    assert min(len(d.text) + 2 for d in docs) >= int(0.95 * 256) - 12  # exact to within a word
    # the queried key + one distractor (a few very long keys leave room for none)
    assert sum(len(d.keys) == 2 for d in docs) >= 95
    assert all(k in WORD_PAIRS for d in docs for k in d.keys)  # keys drawn like the eval's


@pytest.mark.parametrize("ratio", [0, 1.5, "half"])
def test_length_min_ratio_validated(ratio):
    with pytest.raises(UserError, match=r"synthetic.length_min_ratio: must be in \(0, 1\]"):
        SyntheticConfig(length_min_ratio=ratio).validate("data.sources[0].synthetic", 256)


@pytest.mark.parametrize("filler", ["noise", "varied"])
def test_queried_needle_rank_is_not_a_shortcut(filler):
    """Near-full short documents have few insertion points; needles sharing one must not keep
    a fixed order, or a model scores by copying the first (or last) needle instead of matching
    the key. The queried needle's rank among the needles must be uniform."""
    cfg = SyntheticConfig(style="compact", filler=filler, num_keys=3)
    first = last = n = 0
    for i in range(600):
        d = generate_document(cfg, i, length_chars=300, task="niah")
        keys = re.findall(r"magic numbers for ([\w-]+) is:", d.text[: d.prompt_len])
        if len(keys) < 2:
            continue
        n += 1
        first += keys[0] == d.key
        last += keys[-1] == d.key
    assert n > 300
    # mean needle count is 2..3: first and last each expected at 1/3..1/2 of documents
    assert 0.28 < first / n < 0.55 and 0.28 < last / n < 0.55, (first / n, last / n, n)


def test_multivalue_answer_lists_values_in_text_order():
    cfg = SyntheticConfig(style="compact", filler="varied", num_keys=3, num_values=4)
    for i in range(40):
        d = generate_document(cfg, i, length_chars=1200, task="multivalue")
        prompt = d.text[: d.prompt_len]
        in_text = re.findall(re.escape(d.key) + r" is: (\d+)\.", prompt)
        assert in_text == d.values and d.answer == " " + ", ".join(in_text) + "."
        assert [d.text[s:e] for s, e in d.answer_spans] == d.values


def test_queries_ask_several_keys_per_document():
    cfg = SyntheticConfig(style="compact", filler="mixed", num_keys=8, queries=3)
    asked_counts = Counter()
    for i in range(60):
        d = generate_document(cfg, i, length_chars=1000, task="niah")
        prompt = d.text[: d.prompt_len]
        qa = re.findall(r"\nWhat is the special magic number for ([\w-]+)\? "
                        r"The special magic number for \1 is (\d+)\.", prompt)
        asked_counts[len(qa)] += 1
        assert len({k for k, _ in qa} | {d.key}) == len(qa) + 1  # distinct keys, the final one last
        for k, v in qa:  # each earlier answer is the value of that key's needle, and a weighted span
            assert re.search(re.escape(f"numbers for {k} is: {v}."), prompt)
        assert [d.text[s:e] for s, e in d.answer_spans] == [v for _, v in qa] + d.values
        assert d.text.endswith(f"The special magic number for {d.key} is {d.values[0]}.") and len(d.text) <= 1000
    assert asked_counts[2] == 60  # 8 needles + 3 questions fit in 1000 chars
    # short documents drop earlier questions before the final one
    for i in range(20):
        d = generate_document(cfg, i, length_chars=250, task="niah")
        assert len(d.answer_spans) == 1 and d.prompt_len == (d.text.index(f"The special magic number for {d.key} is ")
                                                             + len(f"The special magic number for {d.key} is"))
    # queries=1 leaves the corpus as it was
    assert generate_document(SyntheticConfig(num_keys=8), 3, length_chars=900).text == \
        generate_document(SyntheticConfig(num_keys=8, queries=1), 3, length_chars=900).text


def test_queries_validated():
    with pytest.raises(UserError, match=r"synthetic.queries"):
        SyntheticConfig(queries=0).validate("data.sources[0].synthetic", 256)


@pytest.mark.parametrize("length", [120, 256, 1024, 3000])
def test_recall_documents_repeat_every_entry_in_another_order(length):
    cfg = SyntheticConfig(filler="noise", tasks={"recall": 1.0})
    shuffled = 0
    for i in range(30):
        d = generate_document(cfg, i, length_chars=length)
        assert d.task == "recall" and length - 30 <= len(d.text) <= length
        assert d.text == d.text[: d.prompt_len] + d.answer and d.answer == f" {d.values[0]}."
        defined, asked = d.text.split("\n")
        pairs = re.findall(r"([\w-]+) is: (\d{7})\.", defined)
        queries = re.findall(r"([\w-]+) is: (\d{7})\.", asked)
        assert len(pairs) >= 1 and sorted(pairs) == sorted(queries)  # each entry asked once
        assert len({k for k, _ in pairs}) == len(pairs) and len({v for _, v in pairs}) == len(pairs)
        assert not re.search(r"\d", re.sub(r"[\w-]+ is: \d{7}\.", "", d.text))  # no other digits
        # every repeated value is a weighted answer, in query order; the last one is the answer
        assert [d.text[s:e] for s, e in d.answer_spans] == [v for _, v in queries]
        assert all(s > len(defined) for s, _ in d.answer_spans)
        assert (d.key, d.values[0]) == queries[-1] and set(d.keys) == {k for k, _ in pairs}
        s, e = d.needle_spans[0]
        assert d.text[s:e] == f"{d.key} is: {d.values[0]}." and e <= len(defined)
        shuffled += [k for k, _ in pairs] != [k for k, _ in queries]
    assert shuffled >= (25 if length >= 256 else 0)  # the order is not a shortcut
    # ~26 characters per entry, each written twice
    n = len(re.findall(r"is: ", generate_document(cfg, 0, length_chars=length).text)) // 2
    assert n >= 1 and (length < 256 or abs(n - length / 52) <= 2)


def test_recall_in_the_corpus_and_the_loader_answer_mask():
    syn = SyntheticConfig(num_docs=24, tasks={"recall": 0.5, "passkey": 0.5}, length_min_ratio=0.9)
    corpus = SyntheticCorpus(syn, seq_len=256)
    assert corpus.fallback == {"recall": "recall", "passkey": "passkey"}
    assert Counter(corpus[i].task for i in range(24)).keys() == {"recall", "passkey"}
    assert max(len(corpus[i].text) + 2 for i in range(24)) <= 256
    # one document per row ("pad"): a row's weighted labels are exactly its document's answers
    want = Counter("".join(corpus[i].text[s:e] for s, e in corpus[i].answer_spans) for i in range(24))
    cfg = DataConfig(seq_len=256, micro_batch_size=4, emit_answer_mask=True, prefetch=0, epochs=1,
                     sources=[SourceConfig(kind="synthetic", packing="pad", synthetic=syn)])
    got = Counter()
    for b in build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0):
        for labels, mask in zip(b["labels"].numpy(), b["answer_mask"].numpy()):
            got[bytes(labels[mask].astype(np.uint8)).decode()] += 1
    assert got == want


def test_recall_too_long_for_the_row_is_a_config_error():
    SyntheticConfig(tasks={"recall": 1.0}).validate("data.sources[0].synthetic", 80)
    # the only task: leaving it out is no fix, and style 'short' does not shorten it
    with pytest.raises(UserError, match=r"length_max: 60 tokens is too short for a 'recall' document .*"
                                        r"; use length_max >= \d+$") as e:
        SyntheticConfig(tasks={"recall": 1.0}).validate("data.sources[0].synthetic", 60)
    need = int(str(e.value).rsplit(">= ", 1)[1])
    SyntheticConfig(tasks={"recall": 1.0}).validate("data.sources[0].synthetic", need)


def test_recall_multivalue_keys_list_their_values_in_text_order():
    cfg = SyntheticConfig(filler="varied", num_values=4, recall_multivalue=0.5, tasks={"recall": 1.0})
    counts = Counter()
    for i in range(40):
        d = generate_document(cfg, i, length_chars=1024)
        defined, asked = d.text.split("\n")
        entries = re.findall(r"([\w-]+) is: (\d{7})\.", defined)
        answers = re.findall(r"([\w-]+) is: (\d{7}(?:, \d{7})*)\.", asked)
        assert len({v for _, v in entries}) == len(entries)  # values are distinct
        by_key = {}
        for k, v in entries:  # text order
            by_key.setdefault(k, []).append(v)
        assert {k: vs.split(", ") for k, vs in answers} == by_key  # every key once, all its values
        counts.update(len(vs) for vs in by_key.values())
        assert [d.text[s:e] for s, e in d.answer_spans] == [v for _, vs in answers for v in vs.split(", ")]
        assert d.values == by_key[d.key] and d.answer == " " + ", ".join(d.values) + "."
        assert d.text == d.text[: d.prompt_len] + d.answer
        assert sorted(d.text[s:e] for s, e in d.needle_spans) == sorted(f"{d.key} is: {v}." for v in d.values)
    singles = counts[1] / sum(counts.values())
    assert 0.35 < singles < 0.65 and set(counts) == {1, 4}  # one value, or num_values
    # the default (0) keeps one value per key; the option draws nothing extra when off
    plain = generate_document(SyntheticConfig(num_values=4, tasks={"recall": 1.0}), 7, length_chars=600)
    assert plain.text == generate_document(SyntheticConfig(num_values=4, recall_multivalue=0.0, tasks={"recall": 1.0}),
                                           7, length_chars=600).text
    assert all(len(vs.split(", ")) == 1 for _, vs in re.findall(r"([\w-]+) is: ([\d, ]+)\.", plain.text))


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", True])
def test_recall_multivalue_validated(bad):
    with pytest.raises(UserError, match=r"synthetic.recall_multivalue: must be a probability in \[0, 1\]"):
        SyntheticConfig(recall_multivalue=bad).validate("data.sources[0].synthetic", 256)


@pytest.mark.parametrize("style", ["short", "compact", "ruler"])
@pytest.mark.parametrize("task", ["niah", "multivalue", "passkey"])
def test_line_breaks_put_each_needle_on_a_line_of_its_own(style, task):
    kw = dict(num_keys=8, queries=3, num_values=3, filler="mixed", tasks={task: 1.0})
    lined = 0
    for i in range(40):
        length = 300 + 17 * i
        a = generate_document(SyntheticConfig(line_breaks=1.0, **kw), i, length_chars=length, style=style)
        b = generate_document(SyntheticConfig(**kw), i, length_chars=length, style=style)
        # the same document with some spaces turned into newlines: same length, answers, spans
        assert a.text.replace("\n", " ") == b.text.replace("\n", " ")
        assert ((a.answer_spans, a.needle_spans, a.prompt_len, a.answer)
                == (b.answer_spans, b.needle_spans, b.prompt_len, b.answer))
        assert "\n\n" not in a.text and not a.text.startswith("\n")
        lines = a.text[: a.prompt_len].split("\n")
        for s, e in a.needle_spans:  # every queried needle is a line
            assert a.text[s:e] in lines
        for n in re.findall(r"One of the special magic numbers for [\w-]+ is: \d+\.", a.text):  # and every distractor
            assert n in lines
        lined += len(a.needle_spans)
    assert lined >= 40


def test_line_breaks_share_of_documents():
    kw = dict(num_keys=4, filler="noise", tasks={"niah": 1.0})
    half = [("\n" in generate_document(SyntheticConfig(line_breaks=0.5, **kw), i,
                                       length_chars=400).text.split("\nWhat")[0])
            for i in range(200)]
    assert 0.35 < sum(half) / len(half) < 0.65
    # line_breaks=0 is the corpus as it was (the draw comes from its own stream)
    for i in range(20):
        assert generate_document(SyntheticConfig(line_breaks=0.0, **kw), i, length_chars=400).text == \
            generate_document(SyntheticConfig(**kw), i, length_chars=400).text


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.5", True])
def test_line_breaks_validated(bad):
    with pytest.raises(UserError, match=r"synthetic.line_breaks: must be a probability in \[0, 1\]"):
        SyntheticConfig(line_breaks=bad).validate("data.sources[0].synthetic", 256)
