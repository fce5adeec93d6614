"""Pre-tokenized, pre-packed cache: built once, reused, keyed by config + tokenizer."""
import dataclasses
import json
import os
import threading
import time
from collections import Counter

import numpy as np
import pytest

from helpers.data import collect, make_texts, rebuild_documents, train_bpe, write_jsonl
from longctx.base.errors import UserError
from longctx.data import ByteTokenizer, DataConfig, SourceConfig, SyntheticConfig, build_loader, load_tokenizer
from longctx.data import cache as cache_mod
from longctx.storage import locks

TOK = ByteTokenizer()
TEXTS = make_texts(80, seed=31, min_words=2, max_words=60)


@pytest.fixture
def setup(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    return path, str(tmp_path / "cache")


def cfg_for(path, cache_dir, **kw):
    base = dict(sources=[SourceConfig(name="docs", path=path)], seq_len=48, micro_batch_size=3,
                cache_dir=cache_dir, progress=False, prefetch=0)
    base.update(kw)
    return DataConfig(**base)


def count_builds(monkeypatch):
    calls = []
    real = cache_mod._build

    def spy(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(cache_mod, "_build", spy)
    return calls


def test_built_once_then_reused(setup, monkeypatch):
    path, cache_dir = setup
    calls = count_builds(monkeypatch)
    a = collect(build_loader(cfg_for(path, cache_dir), TOK, dp_rank=0, dp_size=1, seed=0), 10)
    assert len(calls) == 1
    (entry,) = [d for d in os.listdir(cache_dir) if not d.endswith(".lock")]
    assert entry.startswith("docs-")
    meta = json.load(open(os.path.join(cache_dir, entry, "meta.json")))
    assert meta["n_docs"] == len(TEXTS) and meta["ids_dtype"] == "uint16"
    assert meta["n_real_tokens"] == sum(len(t.encode()) + 2 for t in TEXTS)
    b = collect(build_loader(cfg_for(path, cache_dir), TOK, dp_rank=1, dp_size=2, seed=0), 2)
    c = collect(build_loader(cfg_for(path, cache_dir, seed=7), TOK, dp_rank=0, dp_size=1, seed=0), 10)
    assert len(calls) == 1  # other ranks and other seeds reuse it
    assert not np.array_equal(a[0]["input_ids"], c[0]["input_ids"])  # the seed orders the rows
    assert b[0]["input_ids"].shape == (3, 48)


def test_key_changes_with_what_changes_rows(setup, monkeypatch, tmp_path):
    path, cache_dir = setup
    calls = count_builds(monkeypatch)
    build_loader(cfg_for(path, cache_dir), TOK, dp_rank=0, dp_size=1, seed=0)
    build_loader(cfg_for(path, cache_dir, seq_len=64), TOK, dp_rank=0, dp_size=1, seed=0)
    build_loader(cfg_for(path, cache_dir, packing="pad"), TOK, dp_rank=0, dp_size=1, seed=0)
    assert len(calls) == 3
    bpe = load_tokenizer(train_bpe(tmp_path / "tok"))
    build_loader(cfg_for(path, cache_dir, tokenizer=str(tmp_path / "tok")), bpe, dp_rank=0, dp_size=1, seed=0)
    assert len(calls) == 4
    # cheap-to-change options reuse the cache: masking, batch size, prefetch, weights
    build_loader(cfg_for(path, cache_dir, document_masking=False, micro_batch_size=5, prefetch=2),
                 TOK, dp_rank=0, dp_size=1, seed=0)
    assert len(calls) == 4
    write_jsonl(path, TEXTS[:-1])  # the data changed: rebuilt
    build_loader(cfg_for(path, cache_dir), TOK, dp_rank=0, dp_size=1, seed=0)
    assert len(calls) == 5


@pytest.mark.parametrize("streaming", [False, True])
def test_cached_epoch_equals_live_epoch(setup, streaming):
    path, cache_dir = setup
    live = collect(build_loader(cfg_for(path, None, epochs=1, streaming=streaming), TOK, dp_rank=0, dp_size=1, seed=0))
    cached = collect(build_loader(cfg_for(path, cache_dir, epochs=1, streaming=streaming), TOK,
                                  dp_rank=0, dp_size=1, seed=0))
    docs_live = Counter(rebuild_documents(live, TOK.bos_id, TOK.pad_id))
    # cached rows come in a shuffled order: rebuild documents in the cache's own row order
    (entry,) = [d for d in os.listdir(cache_dir) if not d.endswith(".lock")]
    pc = cache_mod.PackedCache(os.path.join(cache_dir, entry))
    rows = [pc.row(j, False) for j in range(pc.n_rows)]
    as_batches = [{"input_ids": r.input_ids[None], "labels": r.labels[None], "position_ids": r.position_ids[None]}
                  for r in rows]
    assert Counter(rebuild_documents(as_batches, TOK.bos_id, TOK.pad_id)) == docs_live
    # the loader serves each cached row exactly once per epoch
    served = Counter(tuple(b["input_ids"][r]) for b in cached for r in range(b["input_ids"].shape[0])
                     if (b["input_ids"][r] != TOK.pad_id).any())
    assert served == Counter(tuple(r.input_ids) for r in rows)
    for b in cached:
        seg, pos = b["segment_ids"], b["position_ids"]
        assert ((np.diff(seg, axis=1) != 0) == (pos[:, 1:] == 0)).all()


def test_dp_shards_of_the_cache_are_disjoint_and_covering(setup):
    path, cache_dir = setup
    seen = []
    for rank in range(3):
        batches = collect(build_loader(cfg_for(path, cache_dir, epochs=1, micro_batch_size=1), TOK,
                                       dp_rank=rank, dp_size=3, seed=0))
        seen.append([tuple(b["input_ids"][0]) for b in batches])
    (entry,) = [d for d in os.listdir(cache_dir) if not d.endswith(".lock")]
    pc = cache_mod.PackedCache(os.path.join(cache_dir, entry))
    assert Counter(sum(seen, [])) == Counter(tuple(pc.row(j, False).input_ids) for j in range(pc.n_rows))
    assert abs(len(seen[0]) - len(seen[2])) <= 1


def test_synthetic_cache_keeps_answer_mask(tmp_path):
    cfg = DataConfig(sources=[SourceConfig(kind="synthetic", packing="pad", synthetic=SyntheticConfig(num_docs=30))],
                     seq_len=192, micro_batch_size=4, emit_answer_mask=True, cache_dir=str(tmp_path / "c"),
                     progress=False, prefetch=0, epochs=1)
    live = collect(build_loader(DataConfig(**{**cfg.__dict__, "cache_dir": None}), TOK, dp_rank=0, dp_size=1, seed=0))
    cached = collect(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0))

    def answers(batches):  # the answer digits of every document
        out = Counter()
        for b in batches:
            for r in range(b["labels"].shape[0]):
                for s in np.unique(b["segment_ids"][r]):
                    m = b["answer_mask"][r] & (b["segment_ids"][r] == s)
                    if m.any():
                        out[bytes(b["labels"][r][m].astype(np.uint8)).decode()] += 1
        return out

    assert answers(live) == answers(cached) and sum(answers(live).values()) > 0


def test_waits_for_another_builder(setup, monkeypatch, capsys):
    """A process finding the lock of a live builder waits for its result, saying whom it waits for."""
    path, cache_dir = setup
    cfg = cfg_for(path, cache_dir)
    desc = cache_mod.cache_description(cfg.sources[0], 0, cfg, TOK)
    final = os.path.join(cache_dir, f"docs-{cache_mod.cache_key(desc)}")
    os.makedirs(cache_dir)
    with open(final + ".lock", "w") as f:  # a live process (this one) is building
        json.dump(dataclasses.asdict(locks.this_process()), f)
    real_build = cache_mod._build

    def other_builder():
        time.sleep(0.6)
        tmp = final + ".tmp-other"
        os.makedirs(tmp)
        real_build(tmp, cfg.sources[0], 0, cfg, TOK, desc, TOK.pad_id)
        os.rename(tmp, final)
        os.remove(final + ".lock")

    t = threading.Thread(target=other_builder)
    t.start()
    calls = count_builds(monkeypatch)
    loader = build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)
    t.join()
    assert calls == [] and next(iter(loader))["input_ids"].shape == (3, 48)
    assert f"waiting for the cache build of {final} by pid {os.getpid()}" in capsys.readouterr().err


def test_resume_refuses_a_rebuilt_cache(setup):
    path, cache_dir = setup
    loader = build_loader(cfg_for(path, cache_dir), TOK, dp_rank=0, dp_size=1, seed=0)
    collect(loader, 2)
    state = loader.state_dict()
    write_jsonl(path, TEXTS[:-3])  # the data changed: another cache key
    with pytest.raises(UserError, match=r"data.sources\[0\]: the checkpoint's data came from cache docs-"):
        build_loader(cfg_for(path, cache_dir), TOK, dp_rank=0, dp_size=1, seed=0).load_state_dict(state)


def test_a_builder_on_another_host_is_waited_for_at_most_cache_wait_s(setup, capsys):
    """Its liveness cannot be checked from here: the wait is bounded, and the line says how to clear it."""
    path, cache_dir = setup
    cfg = cfg_for(path, cache_dir, cache_wait_s=0.3)
    final = cache_mod.cache_path(cfg.sources[0], 0, cfg, TOK)
    os.makedirs(cache_dir)
    remote = locks.Holder("another-host", 4242, None, time.time())
    with open(final + ".lock", "w") as f:
        json.dump(dataclasses.asdict(remote), f)
    with pytest.raises(UserError) as e:
        build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)
    assert str(e.value) == (f"data.cache_dir: waited 0s (data.cache_wait_s) for the cache build by "
                            f"{remote.describe()}; if that host's job is gone, remove {final}.lock")
    assert f"note: waiting for the cache build by {remote.describe()}" in capsys.readouterr().err
    os.remove(final + ".lock")  # cleared: the next run builds
    assert next(iter(build_loader(cfg, TOK, dp_rank=0, dp_size=1, seed=0)))["input_ids"].shape == (3, 48)
