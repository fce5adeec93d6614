"""The validation section's pieces that need no process: position buckets, the held-out data
section (disjoint from training), the rows each dp rank runs."""
import torch

from longctx.config.validation import ValidationSection, bucket_ends, bucket_labels, heldout_data
from longctx.data.config import DataConfig
from longctx.data.source_config import SourceConfig
from longctx.data.synthetic_config import SyntheticConfig
from longctx.train.positions import means_by_position
from longctx.train.validation import rank_batches


def test_default_buckets_are_powers_of_two_up_to_the_length():
    assert bucket_ends(None, 131072) == [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
    assert bucket_ends(None, 256) == [2, 4, 8, 16, 32, 64, 128, 256]
    assert bucket_ends(None, 192) == [2, 4, 8, 16, 32, 64, 128, 192]
    assert bucket_ends([64, 128], 256) == [64, 128, 256]
    assert bucket_ends([64, 256], 256) == [64, 256]
    assert bucket_labels([64, 128, 256]) == ["0-64", "64-128", "128-256"]


def test_an_empty_or_non_finite_bucket_is_null():
    assert means_by_position([2.0, 0.0, float("nan")], [4.0, 0.0, 1.0], [2, 4, 8]) == {
        "0-2": 0.5, "2-4": None, "4-8": None}


def test_default_heldout_corpus_takes_a_seed_no_training_source_uses():
    train = DataConfig(sources=[SourceConfig(kind="synthetic", synthetic=SyntheticConfig(seed=5)),
                                SourceConfig(kind="synthetic", synthetic=SyntheticConfig(seed=6))])
    other_stage = DataConfig(sources=[SourceConfig(kind="synthetic", synthetic=SyntheticConfig(seed=7))])
    held = heldout_data(ValidationSection(every=1), train, [train, other_stage])
    seeds = [s.synthetic.seed for s in held.sources]
    assert len(set(seeds)) == 2 and not set(seeds) & {5, 6, 7}
    assert held.micro_batch_size == 1 and held.cache_dir is None


def test_every_dp_rank_runs_the_same_batches_blank_rows_filling_up():
    rows = [{"input_ids": torch.full((1, 4), i), "labels": torch.full((1, 4), i)} for i in range(5)]
    r0, r1 = rank_batches(rows, 0, 2, 2), rank_batches(rows, 1, 2, 2)
    assert [b["input_ids"].shape for b in r0] == [b["input_ids"].shape for b in r1] == [(2, 4), (1, 4)]
    assert [int(x) for b in r0 for x in b["labels"][:, 0]] == [0, 2, 4]
    assert [int(x) for b in r1 for x in b["labels"][:, 0]] == [1, 3, -100]  # a blank row: no label
