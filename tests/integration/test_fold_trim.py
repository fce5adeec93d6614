"""fold_trailing_padding and trim_unscored_tail across processes: the loss and every gradient
under ring cp = 2 match the batch as packed at cp = 1, and the trainer reports the share of
columns it ran."""
from helpers.cp import check_all, run_distributed
from helpers.rewrite import fold_and_trim_checks, fold_checks
from helpers.train import TINY, metrics, run_train


def test_fold_keeps_loss_and_gradients_ring_cp2():
    check_all(run_distributed(fold_checks, 2), min_checks=4)


def test_trim_keeps_loss_and_gradients_ring_cp2():
    check_all(run_distributed(fold_and_trim_checks, 2), min_checks=4)


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
