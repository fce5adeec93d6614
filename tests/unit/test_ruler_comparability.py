"""results.json's ruler_comparable / departures: false for each departure, true for RULER's setup."""
import json

from longctx.data.tokenizer import load_tokenizer
from longctx.eval.comparability import GENERATOR, WRITTEN, assess, model_has_chat_template, warning_line
from longctx.eval.report import render_markdown, write_results
from longctx.eval.tasks import RULER_TASKS, TaskOptions

BYTE = load_tokenizer("byte")
SUBWORD = object()  # any tokenizer that is not the byte one
FULL = TaskOptions(essay_path="essays.json", squad_path="squad.json", hotpotqa_path="hotpotqa.json",
                   words_path="english_words.json")


def _records(tasks=RULER_TASKS, samples=500, lengths=(4096,), depth=None, meta=None):
    return [{"task": t, "target_length": L, "index": i, "depth": depth, "metric": "string_match_all", "score": 100.0,
             "meta": dict(meta or {})} for t in tasks for L in lengths for i in range(samples)]


def test_only_rulers_own_prepared_data_is_comparable():
    verdict = assess(_records(), TaskOptions(), tokenizer=SUBWORD, ruler_data=True)
    assert verdict == {"ruler_comparable": True, "departures": []}  # essays, QA, words and template are RULER's
    assert warning_line(verdict) is None
    # our generator, even with RULER's data files, lists itself
    assert assess(_records(), FULL, tokenizer=SUBWORD) == {"ruler_comparable": False, "departures": [GENERATOR]}
    # and so do our prompts written with --write-data and read back
    written = assess(_records(meta={"generator": "longctx"}), TaskOptions(), tokenizer=SUBWORD, ruler_data=True)
    assert written == {"ruler_comparable": False, "departures": [WRITTEN]}


def test_builtin_essay_without_qa_is_not_comparable_and_says_why():
    verdict = assess(_records(tasks=RULER_TASKS[:11], samples=10), TaskOptions(), tokenizer=BYTE)
    assert verdict["ruler_comparable"] is False
    text = " | ".join(verdict["departures"])
    for reason in ("built-in essay haystack", "qa_1 and qa_2 not evaluated", "11 of RULER's 13 tasks",
                   "10 samples per task and length (RULER uses 500: samples=500)", "byte tokenizer"):
        assert reason in text, reason
    line = warning_line(verdict)
    assert line.startswith("warning: not comparable with published RULER numbers: ") and "\n" not in line


def test_each_departure_alone_flips_the_flag(tmp_path):
    chat_model = tmp_path / "chat"
    chat_model.mkdir()
    (chat_model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert model_has_chat_template(chat_model) and not model_has_chat_template(tmp_path)
    cases = {
        "no chat template for a chat model": dict(model_dir=chat_model),
        "style=compact": dict(options=TaskOptions(**{**FULL.__dict__, "style": "compact"})),
        "max_new_tokens=8": dict(options=TaskOptions(**{**FULL.__dict__, "max_new_tokens": 8})),
        "controlled depths": dict(records=_records(depth=0.5)),
        "outside RULER's 13 (passkey; leave them out": dict(records=_records(tasks=RULER_TASKS + ["passkey"])),
        "made-up words": dict(options=TaskOptions(**{**FULL.__dict__, "words_path": None}),
                              records=_records(meta={"haystack_units": 5000, "filler_words": 3})),
    }
    for reason, kw in cases.items():
        verdict = assess(kw.get("records", _records()), kw.get("options", FULL), tokenizer=SUBWORD,
                         model_dir=kw.get("model_dir"))
        assert verdict["departures"][0] == GENERATOR and len(verdict["departures"]) == 2, (reason, verdict)
        assert reason in verdict["departures"][1], (reason, verdict)
    with_template = TaskOptions(**{**FULL.__dict__, "chat_template": "llama3-chat"})
    assert assess(_records(), with_template, tokenizer=SUBWORD, model_dir=chat_model)["departures"] == [GENERATOR]
    none = TaskOptions(**{**FULL.__dict__, "chat_template": "none"})
    assert "no chat template for a chat model" in assess(_records(), none, tokenizer=SUBWORD,
                                                         model_dir=chat_model)["departures"][1]


def test_each_hint_names_what_closes_it_in_its_mode():
    """RULER's data: tasks and samples come from prepare.py; the generator's options do not apply."""
    few = _records(tasks=RULER_TASKS[:11], samples=10)
    data = assess(few, TaskOptions(style="compact"), tokenizer=SUBWORD, ruler_data=True)["departures"]
    assert data == ["11 of RULER's 13 tasks evaluated (missing: qa_1, qa_2; prepare them with RULER's prepare.py "
                    "into ruler_data)",
                    "10 samples per task and length (RULER uses 500: prepare.py --num_samples 500)"]
    ours = assess(few, FULL, tokenizer=SUBWORD)["departures"]
    assert "qa_1 and qa_2 not evaluated (pass squad=FILE / hotpotqa=FILE)" in ours
    assert "10 samples per task and length (RULER uses 500: samples=500)" in ours


def test_results_json_and_report_carry_the_verdict(tmp_path):
    verdict = assess(_records(tasks=["niah_single_1"], samples=3), TaskOptions(), tokenizer=BYTE)
    summary = {"threshold": 85.6, "lengths": [4096], "tasks": {"niah_single_1": {
        "metric": "string_match_all", "scores": {"4096": 100.0}, "average": 100.0, "effective_length": 4096}},
        "average_by_length": {"4096": 100.0}, "average_tasks_by_length": {"4096": ["niah_single_1"]},
        "average": 100.0, "wavg_inc": 100.0, "wavg_dec": 100.0, "effective_length": 4096, "grids": {}}
    write_results(tmp_path / "results.json", {}, summary, [], None, [], [], verdict)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["ruler_comparable"] is False and doc["departures"] == verdict["departures"]
    md = render_markdown({}, summary, None, [], [], comparability=verdict)
    assert "Average over 1 tasks: niah_single_1" in md and "wAvg (inc) 100.0" in md
    assert "## Not comparable with published RULER numbers" in md
