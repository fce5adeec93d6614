"""fold_trailing_padding: a row's unscored tail joins the document before it, and the loss and
every gradient stay those of the unfolded batch (cp = 1; ring cp = 2 is in
tests/integration/test_fold_trim.py), fp32 and bf16."""
import torch

from helpers.cp import check_all
from helpers.rewrite import TOL, fold_checks, loss_and_grads, packed_batch, rel_err
from longctx.data.packing import fold_trailing_padding
from longctx.model import build_model, get_preset


def test_fold_cases():
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2],   # doc, doc, padding
                        [0, 0, 0, 0, 0, 1, 1, 1],   # doc, padding
                        [0, 0, 0, 0, 0, 0, 0, 0],   # one document, no padding
                        [0, 0, 0, 0, 1, 1, 1, 1],   # two documents, the last one scored
                        [0, 0, 0, 0, 0, 0, 0, 0]])  # all padding (an empty row)
    lab = torch.full_like(seg, -100)
    lab[0, :4] = 7
    lab[1, :4] = 7
    lab[2, :7] = 7
    lab[3, :7] = 7
    out = fold_trailing_padding(seg, lab)
    assert out.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1],
                            [0, 0, 0, 0, 0, 0, 0, 0],
                            [0, 0, 0, 0, 0, 0, 0, 0],
                            [0, 0, 0, 0, 1, 1, 1, 1],
                            [0, 0, 0, 0, 0, 0, 0, 0]]
    assert seg[0].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]  # the input is not modified


def test_fold_keeps_loss_and_gradients_cp1():
    check_all([fold_checks(0, 1)], min_checks=4)


def test_the_comparison_sees_a_wrong_fold():
    """Control: merging two scored documents (what fold must never do) changes the loss."""
    batch = packed_batch()
    n = int((batch["labels"] != -100).sum())
    ref, _ = loss_and_grads(build_model(get_preset("debug-tiny"), seed=3), batch, n)
    wrong = dict(batch, segment_ids=torch.zeros_like(batch["segment_ids"]))
    loss, _ = loss_and_grads(build_model(get_preset("debug-tiny"), seed=3), wrong, n)
    assert rel_err(loss, ref) > 100 * TOL[torch.float32]
