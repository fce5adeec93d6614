"""trim_unscored_tail: trailing columns no row scores are dropped (rounded to a multiple), and
the loss and every gradient stay those of the full batch (cp = 1, fp32 and bf16; ring cp = 2 and
the trainer's reported share of columns are in tests/integration/test_fold_trim.py)."""
import torch

from helpers.cp import check_all
from helpers.rewrite import fold_and_trim_checks
from longctx.data.packing import trim_unscored_tail


def _labels(last_scored: list, T: int = 16) -> torch.Tensor:
    lab = torch.full((len(last_scored), T), -100)
    for b, last in enumerate(last_scored):
        if last is not None:
            lab[b, :last + 1] = 5
    return lab


def test_trim_cases():
    T = 16
    for last_scored, multiple, expect in [
        ([5, 9], 4, 12),      # last label at column 9 -> keep 10 -> rounded to 12
        ([5, 11], 4, 12),     # already a multiple
        ([3, 15], 4, 16),     # the last column is scored: nothing to drop
        ([2, 1], 8, 8),
        ([None, None], 4, 4),  # no label at all: one multiple survives
        ([9, 9], 64, 16),     # rounding beyond the row keeps the row
    ]:
        lab = _labels(last_scored, T)
        batch = {"input_ids": torch.arange(2 * T).view(2, T), "labels": lab, "loss_weights": torch.ones(2, T),
                 "scalar": 3, "per_row": torch.zeros(2)}
        out = trim_unscored_tail(batch, multiple)
        assert out["input_ids"].shape == (2, expect) and out["loss_weights"].shape == (2, expect), last_scored
        assert torch.equal(out["input_ids"], batch["input_ids"][:, :expect])
        assert (out["labels"] != -100).sum() == (lab != -100).sum()  # no scored token is lost
        assert out["scalar"] == 3 and out["per_row"].shape == (2,)
        assert batch["labels"].shape == (2, T)  # the input is not modified


def test_trim_keeps_loss_and_gradients_cp1():
    check_all([fold_and_trim_checks(0, 1)], min_checks=4)
