"""Loader: mixture proportions, data-parallel sharding, exact resume (map-style, streaming,
cache, prefetch thread), config composition."""
from collections import Counter

import numpy as np
import pytest
import torch

from helpers.data import (
    assert_batches_equal,
    collect,
    make_texts,
    rebuild_documents,
    resume_roundtrip,
    rows_by_source,
    write_jsonl,
    write_parquet,
)
from longctx.base.errors import UserError
from longctx.data import ByteTokenizer, DataConfig, SourceConfig, SyntheticConfig, build_loader

TOK = ByteTokenizer()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("loader")
    long_texts = make_texts(60, seed=11, min_words=20, max_words=120, tag="long")
    short_texts = make_texts(200, seed=12, min_words=1, max_words=12, tag="short")
    return {
        "long": write_parquet(d / "long.parquet", long_texts),
        "short": write_jsonl(d / "short.jsonl", short_texts),
        "long_texts": long_texts, "short_texts": short_texts, "dir": d,
    }


def mixture_config(files, **kw):
    src = [SourceConfig(name="long", path=files["long"], weight=0.6),
           SourceConfig(name="short", path=files["short"], weight=0.4)]
    base = dict(sources=src, seq_len=32, micro_batch_size=4, prefetch=0, shuffle_window=32)
    base.update(kw)
    return DataConfig(**base)


def test_mixture_proportions_within_2_percent(files):
    loader = build_loader(mixture_config(files), TOK, dp_rank=0, dp_size=1, seed=0)
    picks = Counter(loader.next_row()[0] for _ in range(10_000))
    assert abs(picks[0] / 10_000 - 0.6) <= 0.02
    assert abs(picks[1] / 10_000 - 0.4) <= 0.02
    assert loader.source_rows == [picks[0], picks[1]]
    # rows never mix sources: the row's first document tag belongs to its source
    for _ in range(200):
        i, row = loader.next_row()
        text = TOK.decode(row.input_ids)
        assert ("short" in text) != ("long" in text) or text.count("long") + text.count("short") == 0


def test_three_way_mixture_and_zero_weight(files):
    cfg = mixture_config(files)
    cfg.sources.append(SourceConfig(name="off", path=files["short"], weight=0.0))
    cfg.sources[0].weight, cfg.sources[1].weight = 3.0, 1.0
    loader = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=4)
    picks = Counter(loader.next_row()[0] for _ in range(10_000))
    assert picks[2] == 0
    assert abs(picks[0] / 10_000 - 0.75) <= 0.02


@pytest.mark.parametrize("dp_size", [2, 4])
def test_dp_shards_disjoint_and_covering(files, dp_size):
    cfg = mixture_config(files, epochs=1)
    per_rank = []
    for rank in range(dp_size):
        by_source = rows_by_source(build_loader(cfg, TOK, dp_rank=rank, dp_size=dp_size, seed=9))
        docs = Counter()
        for rows in by_source.values():
            docs.update(rebuild_documents(rows, TOK.bos_id, TOK.pad_id))
        per_rank.append(docs)
    union = Counter()
    for a in range(dp_size):
        union.update(per_rank[a])
        for b in range(a + 1, dp_size):
            assert not (set(per_rank[a]) & set(per_rank[b]))  # disjoint
    want = Counter(tuple(TOK.encode(t, add_bos=True, add_eos=True)) for t in files["long_texts"] + files["short_texts"])
    assert union == want  # covering, each document once


@pytest.mark.parametrize("prefetch", [0, 3])
def test_resume_mid_epoch_map_style(files, prefetch):
    # 60 long documents of ~40-600 bytes at seq_len 32: resumes inside documents, windows, epochs
    cfg = mixture_config(files, prefetch=prefetch, shuffle_window=8)
    cfg.sources[0].upsample = [__import__("longctx.data", fromlist=["UpsampleBucket"]).UpsampleBucket(
        min_tokens=300, factor=1.5)]

    def make():
        return build_loader(cfg, TOK, dp_rank=1, dp_size=2, seed=3)
    for n_before in (1, 7, 23):
        resume_roundtrip(make, n_before, 12)


def test_resume_streaming(files):
    cfg = mixture_config(files, streaming=True, shuffle_window=5)
    def make():
        return build_loader(cfg, TOK, dp_rank=0, dp_size=2, seed=1)
    full = resume_roundtrip(make, 9, 15)
    resume_roundtrip(make, 40, 10)  # past the end of an epoch of the short source
    # streaming and map-style read the same documents over an epoch
    cfg1 = mixture_config(files, streaming=True, epochs=1)
    cfg2 = mixture_config(files, streaming=False, epochs=1)
    docs = []
    for c in (cfg1, cfg2):
        by_source = rows_by_source(build_loader(c, TOK, dp_rank=0, dp_size=1, seed=0))
        docs.append({i: Counter(rebuild_documents(r, TOK.bos_id, TOK.pad_id)) for i, r in by_source.items()})
    assert docs[0] == docs[1] and len(docs[0]) == 2
    assert len(full) == 24


def test_resume_with_cache(files, tmp_path):
    cfg = mixture_config(files, cache_dir=str(tmp_path / "cache"), progress=False, prefetch=2)
    def make():
        return build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=2)
    resume_roundtrip(make, 5, 10)
    resume_roundtrip(make, 70, 10)  # after the row order of an epoch wrapped


def test_resume_synthetic_default_with_answer_mask():
    cfg = DataConfig(seq_len=192, micro_batch_size=2, emit_answer_mask=True, shuffle_window=16,
                     sources=[SourceConfig(kind="synthetic", packing="pad", synthetic=SyntheticConfig(num_docs=50))])
    def make():
        return build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)
    full = resume_roundtrip(make, 13, 20)  # wraps the 50-document epoch
    b = full[0]
    assert b["answer_mask"].dtype == bool and b["answer_mask"].any()
    # an answer-mask position's target is a digit of the value
    targets = b["labels"][b["answer_mask"]]
    assert all(48 <= t <= 57 for t in targets.tolist())


def test_iterating_again_continues_after_the_last_consumed_batch(files):
    cfg = mixture_config(files, prefetch=4)
    loader = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)
    full = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0), 10)
    part1 = collect(loader, 4)  # the producer thread ran ahead; iterating again must not skip
    part2 = collect(loader, 6)
    assert_batches_equal(part1 + part2, full)


def test_state_mismatch_is_a_user_error(files):
    cfg = mixture_config(files)
    state = build_loader(cfg, TOK, dp_rank=0, dp_size=2, seed=0).state_dict()
    with pytest.raises(UserError, match="dp_size=2 but this run has dp_size=4"):
        build_loader(cfg, TOK, dp_rank=0, dp_size=4, seed=0).load_state_dict(state)
    state2 = torch.load(__import__("io").BytesIO(_torch_bytes(state)), weights_only=True)
    build_loader(cfg, TOK, dp_rank=0, dp_size=2, seed=0).load_state_dict(state2)


def _torch_bytes(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_seed_changes_order_and_cfg_seed_overrides(files):
    cfg = mixture_config(files)
    a = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0), 3)
    b = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=1), 3)
    assert not np.array_equal(a[0]["input_ids"], b[0]["input_ids"])
    cfg.seed = 0
    c = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=1), 3)
    assert_batches_equal(a, c)


def test_omegaconf_structured_composition(files):
    from dataclasses import dataclass, field

    from omegaconf import OmegaConf

    @dataclass
    class Top:
        data: DataConfig = field(default_factory=DataConfig)

    conf = OmegaConf.merge(OmegaConf.structured(Top), OmegaConf.create({"data": {
        "seq_len": 48, "micro_batch_size": 2,
        "sources": [{"path": files["short"], "weight": 2.0, "upsample": [{"min_tokens": 40, "factor": 2}]}],
    }}))
    assert conf.data.sources[0].text_field == "text"
    loader = build_loader(conf.data, TOK, dp_rank=0, dp_size=1, seed=0)  # a DictConfig is accepted
    b = next(iter(loader))
    assert b["input_ids"].shape == (2, 48) and b["input_ids"].dtype == torch.long
    default = OmegaConf.structured(Top).data
    assert default.sources[0].kind == "synthetic"
    b = next(iter(build_loader(default, TOK, dp_rank=0, dp_size=1, seed=0)))
    assert b["input_ids"].shape == (8, 256)


def test_plain_dicts_are_accepted(files):
    cfg = DataConfig(sources=[{"path": files["short"], "upsample": [{"min_tokens": 30, "factor": 2.0}]}],
                     seq_len=32, micro_batch_size=2, prefetch=0)
    assert next(iter(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)))["input_ids"].shape == (2, 32)
    as_dict = {"seq_len": 32, "micro_batch_size": 2, "sources": [{"path": files["short"]}]}
    assert next(iter(build_loader(as_dict, TOK, dp_rank=0, dp_size=1, seed=0)))["input_ids"].shape == (2, 32)
    with pytest.raises(UserError, match=r"data.sources\[0\]: .*unexpected keyword argument 'text_column'"):
        build_loader(DataConfig(sources=[{"path": files["short"], "text_column": "x"}]), TOK,
                     dp_rank=0, dp_size=1, seed=0)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_new_iterator_replaces_the_old_one(files, prefetch):
    cfg = mixture_config(files, prefetch=prefetch)
    full = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0), 8)
    loader = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)
    old = iter(loader)
    first = [{k: v.numpy() for k, v in next(old).items()} for _ in range(3)]
    new = iter(loader)
    rest = [{k: v.numpy() for k, v in next(new).items()} for _ in range(5)]
    assert_batches_equal(first + rest, full)
    with pytest.raises(RuntimeError, match="replaced by a newer"):
        next(old)


def test_errors_in_the_prefetch_thread_reach_the_consumer(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", ["hello"])
    cfg = DataConfig(sources=[SourceConfig(path=path, text_field="id")], streaming=True, prefetch=2)
    # streaming only sees values when reading: the error is raised in the producer thread
    loader = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)
    with pytest.raises(UserError, match=r"data.sources\[0\].text_field: .*a.jsonl row 1: 'id' holds int, not text"):
        next(iter(loader))
