"""Loader states resharded to another dp size equal the states of a fresh run at that dp size
after the same rows (cached: computed from the saved states; uncached: replayed), and the
loaders then hand out the same batches."""
import pytest

from helpers.data import collect, make_texts, write_jsonl
from longctx.base.errors import UserError
from longctx.checkpoint.layout import loader_state
from longctx.data import ByteTokenizer, DataConfig, SourceConfig, build_loader
from longctx.data.reshard import by_dp_rank

TOK = ByteTokenizer()


def _config(tmp_path, *, cached: bool, weights=(1.0,), epochs=None) -> DataConfig:
    sources = [SourceConfig(name=f"s{i}",
                            path=write_jsonl(tmp_path / f"s{i}.jsonl", make_texts(30 + 11 * i, seed=i, max_words=8)),
                            weight=w) for i, w in enumerate(weights)]
    return DataConfig(sources=sources, seq_len=48, micro_batch_size=1, epochs=epochs, prefetch=0, progress=False,
                      cache_dir=str(tmp_path / "cache") if cached else None)


def _run(cfg, dp_rank, dp_size, rows):
    loader = build_loader(cfg, TOK, dp_rank=dp_rank, dp_size=dp_size, seed=3)
    collect(loader, rows) if rows else None
    return loader


@pytest.mark.parametrize("cached, weights, epochs, old_dp, new_dp, rows", [
    (True, (1.0,), None, 2, 1, 90),           # past the end of an epoch (a source of ~40 rows)
    (True, (1.0,), None, 1, 3, 90),
    (True, (1.0, 2.0), None, 3, 2, 60),        # a mixture
    (True, (1.0, 1.0), 1, 2, 3, 60),           # finite: a source runs out on the way
    (False, (1.0, 2.0), None, 2, 1, 24),       # no cache: replayed
])
def test_resharded_state_is_a_fresh_run_at_the_new_dp_size(tmp_path, cached, weights, epochs, old_dp, new_dp, rows):
    cfg = _config(tmp_path, cached=cached, weights=weights, epochs=epochs)
    saved = [{"data": _run(cfg, r, old_dp, rows // old_dp).state_dict(), "rng": None} for r in range(old_dp)]
    for r in range(new_dp):
        state, note = loader_state(saved, dp_rank=r, dp_size=new_dp, micro_batch_size=1,
                                   fresh_loader=lambda: build_loader(cfg, TOK, dp_rank=r, dp_size=new_dp, seed=3))
        reference = _run(cfg, r, new_dp, rows // new_dp)
        assert state == reference.state_dict()
        assert (note is None) == cached
        resumed = build_loader(cfg, TOK, dp_rank=r, dp_size=new_dp, seed=3)
        resumed.load_state_dict(state)
        after, expected = collect(resumed, 5), collect(reference, 5)
        assert len(after) == len(expected)
        for a, b in zip(after, expected):
            assert (a["input_ids"] == b["input_ids"]).all()


def test_a_missing_dp_rank_is_named(tmp_path):
    cfg = _config(tmp_path, cached=True)
    states = [_run(cfg, r, 3, 2).state_dict() for r in (0, 2)]
    with pytest.raises(UserError, match="no state of data-parallel rank 1 of 3"):
        by_dp_rank(states)
