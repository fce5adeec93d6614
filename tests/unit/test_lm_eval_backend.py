"""longctx as an lm-eval model: on an exported tiny model and lm-eval tasks over small local JSON
files (tests/data/lm_eval), loglikelihood equals lm-eval's own `hf` model (fp32: within 1e-4 per
request, rolling sums within 1e-6 relative), generate_until gives the same text, the chat
template renders as transformers renders it, and a stopped run continues from lm-eval's request
cache."""
import json

import pytest

from helpers.lm_eval_tasks import DATA as TASK_DATA
from helpers.lm_eval_tasks import TASKS, write_model, write_tasks
from longctx.base.errors import UserError
from longctx.eval.config import EvalConfig
from longctx.eval.harness import loglik as loglik_module
from longctx.eval.harness.model import LongctxLM, Stopped
from longctx.eval.harness.options import parse_args, task_manager
from longctx.eval.harness.run import run_tasks

lm_eval = pytest.importorskip("lm_eval")
from lm_eval import simple_evaluate  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

pytestmark = pytest.mark.usefixtures("lm_eval_without_git")  # tests/unit/conftest.py


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_DATASETS_OFFLINE", "1")
    d = tmp_path_factory.mktemp("lm_eval")
    model_dir, include = write_model(d / "model"), write_tasks(d / "tasks")
    yield model_dir, str(include)
    mp.undo()


@pytest.fixture(scope="module")
def both(setup):
    """Our model's and lm-eval's `hf` model's answers on the three local tasks."""
    model_dir, include = setup
    from lm_eval.models.huggingface import HFLM

    ours = LongctxLM.from_pretrained(str(model_dir), dtype="fp32")
    hf = HFLM(pretrained=str(model_dir), dtype="float32", device="cpu")
    runs = [simple_evaluate(model=lm, tasks=list(TASKS), task_manager=task_manager(TASKS, include), log_samples=True)
            for lm in (ours, hf)]
    return ours, hf, runs


def _requests(kind, args):
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_loglikelihood_and_generation_equal_lm_evals_hf_model(both):
    _, _, (ours, ref) = both
    for task in TASKS:
        assert len(ours["samples"][task]) == len(ref["samples"][task]) > 0
        for a, b in zip(ours["samples"][task], ref["samples"][task]):
            assert a["doc_id"] == b["doc_id"]
            for x, y in zip(a["resps"], b["resps"]):
                if task == "lc_gen":
                    assert x == y  # the same text
                elif task == "lc_rolling":
                    assert x[0] == pytest.approx(y[0], rel=1e-6, abs=1e-4)  # sums of ~200 fp32 token losses
                else:
                    assert x[0][0] == pytest.approx(y[0][0], abs=1e-4) and x[0][1] == y[0][1]
    assert ours["results"]["lc_choice"]["acc,none"] == ref["results"]["lc_choice"]["acc,none"]


def test_greedy_flags_stop_strings_and_chat_template(both, setup):
    lm, hf, _ = both
    from transformers import AutoTokenizer

    context = "Q: What colour is grass?\nA:"
    free = lm.generate_until(_requests("generate_until", [(context, {"until": [], "max_gen_toks": 10})]))[0]
    assert len(free) >= 4
    # token level: the model's own greedy tokens are greedy; one token changed is not
    ctx = lm.tok_encode(context)
    greedy = lm.engine.generate_ids([ctx], 3)[0]
    other = greedy[:2] + [(greedy[2] + 1) % 256]
    reqs = [(None, ctx, greedy), (None, ctx, other), (None, [lm.prefix_token_id], lm.tok_encode("abc"))]
    ours, theirs = lm._loglikelihood_tokens(reqs), hf._loglikelihood_tokens(reqs)
    assert [g for _, g in ours] == [g for _, g in theirs] == [True, False, False]
    for (a, _), (b, _) in zip(ours, theirs):
        assert a == pytest.approx(b, abs=1e-4)
    pairs = [(context, " green"), ("", "abc")]  # text requests, an empty context among them
    for (a, _), (b, _) in zip(*(m.loglikelihood(_requests("loglikelihood", pairs)) for m in (lm, hf))):
        assert a == pytest.approx(b, abs=1e-4)
    # a stop string inside the free text cuts it where lm-eval's hf model cuts it
    cut = [(context, {"until": [free[2]], "max_gen_toks": 10, "do_sample": False})]
    assert lm.generate_until(_requests("generate_until", cut)) == hf.generate_until(_requests("generate_until", cut))
    before = lm.engine.stats["new_tokens"]
    assert len(lm.generate_until(_requests("generate_until", cut))[0]) < len(free)
    assert lm.engine.stats["new_tokens"] - before < 10  # decoding stopped at the stop string, not at max_gen_toks
    with pytest.raises(UserError, match="decodes greedily"):
        lm.generate_until(_requests("generate_until", [(context, {"do_sample": True, "temperature": 1.0})]))
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    want = AutoTokenizer.from_pretrained(str(setup[0])).apply_chat_template(chat, tokenize=False,
                                                                         add_generation_prompt=True)
    assert lm.apply_chat_template(chat) == want


def test_chat_template_and_multiturn_fewshot_as_lm_eval_renders_them(both, setup):
    """apply_chat_template with one few-shot example as turns: the same prompts as the hf model's
    (the tokenizer's template), the same answers."""
    lm, hf, _ = both
    tasks = ["lc_choice", "lc_gen"]
    ours, ref = (simple_evaluate(model=m, tasks=tasks, task_manager=task_manager(tuple(tasks), setup[1]),
                                 apply_chat_template=True, num_fewshot=1, limit=2) for m in (lm, hf))
    for task in tasks:
        for a, b in zip(ours["samples"][task], ref["samples"][task]):
            assert a["arguments"] == b["arguments"] and "<|im_start|>assistant" in str(a["arguments"])
            if task == "lc_gen":
                assert a["resps"] == b["resps"]
            else:
                assert [x[0][0] for x in a["resps"]] == pytest.approx([y[0][0] for y in b["resps"]], abs=1e-4)


def test_a_stopped_run_continues_from_the_request_cache(both, setup, tmp_path, monkeypatch):
    lm, _, (ours, _) = both
    include = setup[1]
    cfg = EvalConfig(model=str(setup[0]), lm_eval=["lc_choice", "lc_rolling"], out=str(tmp_path),
                     lm_eval_args=f"include_path={include}", batch_size=2)
    identity = {"model": "tiny"}

    class StopAfter:
        def __init__(self, n):
            self.calls, self.n = 0, n

        def agreed(self):
            self.calls += 1
            return self.calls > self.n

    with pytest.raises(Stopped):
        run_tasks(cfg, lm.model, lm.tokenizer, identity=identity, stop=StopAfter(2))
    scored = []
    real = loglik_module.score_rows
    monkeypatch.setattr("longctx.eval.harness.model.score_rows",
                        lambda model, rows, **kw: scored.extend(rows) or real(model, rows, **kw))
    section = run_tasks(cfg, lm.model, lm.tokenizer, identity=identity)
    # 16 choice requests + 3 rolling texts; the three batches (6 requests) before the stop came from the cache
    assert len(scored) == 16 + 3 - 6
    assert section["tasks"]["lc_choice"]["metrics"]["acc,none"] == ours["results"]["lc_choice"]["acc,none"]
    assert section["tasks"]["lc_choice"]["scale"] == 100.0 and len(section["tasks"]["lc_choice"]["scores"]) == 6
    rows = [json.loads(x) for x in (tmp_path / "lm_eval" / "samples_lc_choice.jsonl").read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == list(range(6))
    with pytest.raises(UserError, match="another model's lm-eval answers"):
        run_tasks(cfg, lm.model, lm.tokenizer, identity={"model": "other"})


def test_bad_lm_eval_options_are_one_line_errors(setup, monkeypatch):
    with pytest.raises(UserError, match="eval.lm_eval_args: unknown option 'bogus'"):
        parse_args("bogus=1")
    with pytest.raises(UserError, match="eval.lm_eval_args: limit must be a number"):
        parse_args("limit=many")
    assert parse_args('num_fewshot=2,limit=0.5,apply_chat_template=true') == {
        "num_fewshot": 2, "limit": 0.5, "apply_chat_template": True}
    from lm_eval.tasks import TaskManager

    # lm-eval's own index (seconds to build) stands in as the local one: the task is in neither
    monkeypatch.setattr("longctx.eval.harness.options._index",
                        lambda include, defaults: TaskManager(include_path=include, include_defaults=False))
    cfg = EvalConfig(model=str(setup[0]), suite=["none"], lm_eval=["no_such_task"],
                     lm_eval_args=f"include_path={setup[1]}")
    with pytest.raises(UserError, match="eval.lm_eval: unknown lm-eval task"):
        cfg.validate(1)
    with pytest.raises(UserError, match="eval.suite: none, and no --lm-eval tasks"):
        EvalConfig(model=str(setup[0]), suite=["none"]).validate(1)


def test_served_models_go_through_lm_evals_openai_models_after_longctxs_checks(setup, tmp_path, monkeypatch):
    """--endpoint: the server is probed as for RULER (a model it does not list is refused before any
    prompt), then lm-eval's local-completions sends the task's prompts and scores the replies."""
    from helpers.openai_standin import Script, serve
    from longctx.commands.cli import main

    model, include = setup
    script = Script(answer=" green")
    server, url = serve(script)
    args = ["eval", "--endpoint", url, "--tokenizer", str(model), "--suite", "none", "--lm-eval", "lc_gen",
            "--lm-eval-args", f"include_path={include}", "--no-progress"]
    try:
        assert main(args + ["--served-model", "other", "--out", str(tmp_path / "refused")]) == 2
        assert not any(path == "/v1/completions" for path, _, _ in script.requests)
        assert main(args + ["--out", str(tmp_path / "o")]) == 0
    finally:
        server.shutdown()
        server.server_close()
    prompts = [body["prompt"] for path, _, body in script.requests if path == "/v1/completions"]
    questions = [d["question"] for d in json.loads((TASK_DATA / "gen.json").read_text())]
    assert sorted(p for p in prompts if p in questions) == sorted(questions)
    section = json.loads((tmp_path / "o" / "results.json").read_text())["lm_eval"]
    assert section["tasks"]["lc_gen"]["metrics"]["exact_match,none"] == pytest.approx(0.2)  # " green" is 1 of 5
