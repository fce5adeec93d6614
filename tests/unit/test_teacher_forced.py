"""Teacher-forced scoring (eval/teacher_forced.py): which tokens are scored, and how a sample's
score follows from its references' argmax hits."""
import pytest
import torch

from longctx.base.errors import UserError
from longctx.base.labels import IGNORE_INDEX
from longctx.eval.cells import task_cells
from longctx.eval.config import EvalConfig
from longctx.eval.tasks import Sample
from longctx.eval.teacher_forced import forced_row, reference_pieces, score_batch


def _sample(outputs, metric="string_match_all"):
    return Sample(task="t", index=0, input="ctx", answer_prefix=" A:", outputs=outputs, metric=metric,
                  target_length=64, max_new_tokens=8)


def _bytes(text):
    return list(text.encode())


class Oracle(torch.nn.Module):
    """Logits whose argmax at position t is the row's token t + 1, except where `wrong` says."""

    def __init__(self, wrong=()):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.wrong = set(wrong)

    def forward(self, input_ids, position_ids=None, logits_at=None):
        nxt = torch.roll(input_ids, -1, dims=1)  # (B, T)
        for b, t in self.wrong:
            nxt[b, t] = (nxt[b, t] + 1) % 256
        logits = torch.nn.functional.one_hot(nxt, 256).float()  # (B, T, V)
        return logits[logits_at]  # (N, V)


def test_the_reference_follows_the_prompt_and_each_token_is_scored_where_it_is_predicted():
    s = _sample(["12", "ab"])
    assert reference_pieces(s) == [" 12", ", ab"]
    assert reference_pieces(_sample(["x", "y"], "string_match_part")) == [" x"]  # QA: the first reference
    row = forced_row(s, _bytes, _bytes)
    prompt = _bytes(s.prompt)
    assert row.input_ids == prompt + _bytes(" 12, ab")
    n = len(prompt)
    assert row.labels[:n - 1] == [IGNORE_INDEX] * (n - 1) and row.labels[-1] == IGNORE_INDEX
    assert row.labels[n - 1:-1] == _bytes(" 12, ab")  # pre-shifted: the token before predicts each
    assert row.refs[n - 1:-1] == [0, 0, 0, 1, 1, 1, 1] and row.n_refs == 2


def test_a_sample_scores_the_share_of_references_whose_tokens_are_all_the_argmax():
    rows = [forced_row(_sample(["12", "ab"]), _bytes, _bytes), forced_row(_sample(["7"]), _bytes, _bytes)]
    right = score_batch(Oracle(), rows, pad_id=0)
    assert [(score, hits) for score, _, hits in right] == [(100.0, 7), (100.0, 2)]
    assert right[0][1] == _bytes(" 12, ab")  # the argmax ids of the answer positions
    n0 = len(rows[0].input_ids) - 7  # the first answer token of row 0 is predicted at n0 - 1
    n1 = len(rows[1].input_ids) - 2
    # one wrong token in reference "ab" of row 0, one in row 1's only reference
    wrong = score_batch(Oracle(wrong=[(0, n0 - 1 + 5), (1, n1)]), rows, pad_id=0)
    assert [(score, hits) for score, _, hits in wrong] == [(50.0, 6), (0.0, 1)]


def test_the_mode_is_part_of_a_cells_key_and_checked_like_any_field():
    samples = [_sample(["12"])]
    generated, forced = task_cells(samples, True), task_cells(samples, True, mode="teacher_forced")
    assert "mode" not in generated[0].fields and forced[0].fields["mode"] == "teacher_forced"
    identity = {"model": {}}
    assert generated[0].key(identity) != forced[0].key(identity)
    with pytest.raises(UserError, match="^eval.mode: 'fast' is not valid; valid: generate, teacher_forced$"):
        EvalConfig(model="m", mode="fast").validate(1)
    with pytest.raises(UserError, match="^eval.mode: teacher_forced runs each sample on one process"):
        EvalConfig(model="m", mode="teacher_forced", cp=2).validate(2)
