"""Bad CP layouts fail with one clear UserError naming the field; sharding helpers (the errors on a
real process group are in tests/integration/test_cp_collective_errors.py)."""
import pytest
import torch

from longctx.base.errors import UserError
from longctx.parallel import (
    positions_from_segments,
    shard_batch,
    shard_sequence,
    unshard_sequence,
    validate_cp,
    zigzag_indices,
)


def test_valid_layouts():
    assert validate_cp(8, 4, "ring", None, 32, 8, 4096).ring_size == 4
    assert validate_cp(8, 4, "ulysses", None, 32, 8, 4096).ulysses_size == 4
    lay = validate_cp(8, 8, "hybrid", 2, 32, 8, 4096)
    assert (lay.ulysses_size, lay.ring_size) == (2, 4)
    assert validate_cp(4, 4, "ulysses", 4, 8, 1, 64).ulysses_size == 4  # MQA: kv head replicated
    assert validate_cp(1, 1, "ring", None, 4, 4, 7).cp_size == 1  # cp=1: any length
    # head counts the Ulysses degree does not split evenly: uneven head shards
    for cp, impl, u in ((2, "ulysses", None), (4, "ulysses", None), (4, "hybrid", 2), (4, "hybrid", 4)):
        assert validate_cp(4, cp, impl, u, 9, 3, 4096).ulysses_size == (u or cp)
    assert validate_cp(4, 4, "ulysses", None, 12, 6, 64).ulysses_size == 4
    assert validate_cp(4, 4, "ulysses", None, 6, 2, 64).ulysses_size == 4
    # hybrid with ulysses_size 0: the degree chosen from the heads (parallel/heads.py)
    auto = lambda cp, h, kv: validate_cp(8, cp, "hybrid", 0, h, kv, 4096)  # noqa: E731
    assert [(lay.ulysses_size, lay.ring_size) for lay in (auto(4, 9, 3), auto(2, 9, 3), auto(8, 32, 8))] == \
        [(2, 2), (2, 1), (8, 1)]


@pytest.mark.parametrize("args, field, hint", [
    ((4, 2, "ring", None, 8, 2, 102), "data.seq_len=102", "valid nearby: 100, 104"),
    ((4, 4, "allgather", None, 8, 2, 36), "data.seq_len=36", "2*parallel.cp_size=8"),
    ((4, 4, "ulysses", None, 2, 2, 64), "parallel.ulysses_size=4", "attention heads (2)"),
    ((4, 4, "hybrid", 4, 3, 1, 64), "parallel.ulysses_size=4", "valid: 1, 2"),
    ((4, 3, "ring", None, 8, 2, 60), "parallel.cp_size=3", "valid: 1, 2, 4"),
    ((4, 2, "zigzag", None, 8, 2, 64), "parallel.cp_impl='zigzag'", "valid: ring, allgather, ulysses, hybrid"),
    ((4, 4, "hybrid", 3, 8, 2, 64), "parallel.ulysses_size=3", "valid: 1, 2, 4"),
    ((4, 4, "hybrid", None, 8, 2, 64), "parallel.ulysses_size=None", "cp_impl hybrid"),
    ((4, 2, "ring", 2, 8, 2, 64), "parallel.ulysses_size=2", "only to cp_impl ulysses or hybrid"),
    ((4, 4, "ulysses", 2, 8, 2, 64), "parallel.ulysses_size=2", "must equal parallel.cp_size=4"),
    ((4, 0, "ring", None, 8, 2, 64), "parallel.cp_size=0", ">= 1"),
])
def test_bad_config_names_the_field(args, field, hint):
    with pytest.raises(UserError) as exc:
        validate_cp(*args)
    msg = str(exc.value)
    assert field in msg and hint in msg and "\n" not in msg, msg


def test_zigzag_layout_and_round_trip():
    assert zigzag_indices(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert zigzag_indices(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    x = torch.arange(2 * 24 * 3).view(2, 24, 3)
    for P in (1, 2, 3, 4):
        shards = [shard_sequence(x, r, P, dim=1) for r in range(P)]
        assert torch.equal(unshard_sequence(shards, dim=1), x)
    # every token owned exactly once; the causal work (sum of positions + 1) is balanced
    P, L = 4, 64
    idx = [zigzag_indices(L, r, P) for r in range(P)]
    assert sorted(torch.cat(idx).tolist()) == list(range(L))
    assert len({int((i + 1).sum()) for i in idx}) == 1


def test_shard_batch_and_document_positions():
    seg = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]])
    assert positions_from_segments(seg).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    ids = torch.arange(8)[None] + 100
    labels = torch.cat([ids[:, 1:], torch.tensor([[-100]])], 1)
    full = {"input_ids": ids, "labels": labels, "segment_ids": seg, "loss_weights": torch.arange(8.)[None],
            "note": "kept"}
    local = shard_batch(full, 1, 2)
    assert local["input_ids"].tolist() == [[102, 103, 104, 105]]
    assert local["labels"].tolist() == [[103, 104, 105, 106]]  # targets stay with their inputs
    assert local["position_ids"].tolist() == [[2, 0, 1, 0]]  # global, restarting per document
    assert local["segment_ids"].tolist() == [[0, 1, 1, 2]] and local["note"] == "kept"
    assert local["loss_weights"].tolist() == [[2.0, 3.0, 4.0, 5.0]]
    plain = shard_batch({"input_ids": ids}, 0, 2)
    assert plain["position_ids"].tolist() == [[0, 1, 6, 7]]
