"""trim_unscored_tail: trailing columns no row scores are dropped (rounded to a multiple), and
the loss and every gradient stay those of the full batch (cp = 1 and ring cp = 2, fp32 and
bf16); the trainer reports the share of columns it ran."""
import torch

from helpers.cp import check_all, run_distributed
from longctx.data.packing import fold_trailing_padding, trim_unscored_tail
from integration.test_fold_padding import compare_rewritten
from helpers.train import TINY, metrics, run_train


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


def _fold_and_trim(batch, world):
    """What the trainer does to a batch before sharding it."""
    folded = dict(batch, segment_ids=fold_trailing_padding(batch["segment_ids"], batch["labels"]))
    trimmed = trim_unscored_tail(folded, 2 * max(world, 2))
    assert trimmed["input_ids"].shape[1] < batch["input_ids"].shape[1]  # the case really trims
    return trimmed


def _worker(rank, world):
    return (compare_rewritten(rank, world, torch.float32, _fold_and_trim)
            + compare_rewritten(rank, world, torch.bfloat16, _fold_and_trim))


def test_trim_keeps_loss_and_gradients_cp1():
    check_all([_worker(0, 1)], min_checks=4)


def test_trim_keeps_loss_and_gradients_ring_cp2():
    check_all(run_distributed(_worker, 2), min_checks=4)


def test_trainer_reports_the_columns_it_ran(tmp_path):
    """One synthetic document of 0.5-1x the row per row (`pad` packing, one row per step): the
    step runs the document's columns rounded up to 64, not the padding after it; documents as
    long as the row run every column."""
    fractions = {}
    for name, ratio in (("short", 0.5), ("full", 1.0)):
        out = tmp_path / name
        r = run_train(1, TINY + [f"out_dir={out}", "model.preset=debug-tiny", "train.steps=6", "data.seq_len=512",
                                 "data.micro_batch_size=1",
                                 "data.sources=[{name: s, kind: synthetic, packing: pad, synthetic: "
                                 f"{{length_min_ratio: {ratio}, tasks: {{passkey: 1.0}}}}}}]"])
        assert r.returncode == 0, r.stderr[-2000:]
        fractions[name] = [m["computed_fraction"] for m in metrics(out)]
    assert len(fractions["short"]) == 6 and all(f * 512 % 64 == 0 for f in fractions["short"]), fractions
    assert all(f <= 1 for f in fractions["short"]) and min(fractions["short"]) < 0.9, fractions
    assert all(f == 1.0 for f in fractions["full"]), fractions
