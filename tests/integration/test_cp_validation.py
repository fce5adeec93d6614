"""Bad CP input fails with one clear UserError before any collective; sharding helpers."""
import pytest
import torch
import torch.distributed as dist

from helpers.cp import run_distributed
from longctx.attention import eager_attention
from longctx.errors import UserError
from longctx.parallel import (
    gather_sequence, make_cp_attention, positions_from_segments, shard_batch, shard_sequence, unshard_sequence, validate_cp,
    zigzag_indices,
)


def test_valid_layouts():
    assert validate_cp(8, 4, "ring", None, 32, 8, 4096).ring_size == 4
    assert validate_cp(8, 4, "ulysses", None, 32, 8, 4096).ulysses_size == 4
    lay = validate_cp(8, 8, "hybrid", 2, 32, 8, 4096)
    assert (lay.ulysses_size, lay.ring_size) == (2, 4)
    assert validate_cp(4, 4, "ulysses", 4, 8, 1, 64).ulysses_size == 4  # MQA: kv head replicated
    assert validate_cp(1, 1, "ring", None, 4, 4, 7).cp_size == 1  # cp=1: any length


@pytest.mark.parametrize("args, field, hint", [
    ((4, 2, "ring", None, 8, 2, 102), "data.seq_len=102", "valid nearby: 100, 104"),
    ((4, 4, "allgather", None, 8, 2, 36), "data.seq_len=36", "2*parallel.cp_size=8"),
    ((4, 4, "ulysses", None, 6, 2, 64), "parallel.ulysses_size=4", "attention heads (6)"),
    ((4, 4, "ulysses", None, 12, 6, 64), "parallel.ulysses_size=4", "kv heads (6)"),
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


def _errors_worker(rank, world):
    """Every bad call must raise on every rank without issuing a collective; a valid call
    afterwards proves no rank is left half-way through a collective."""
    seen = []

    def expect(fn, needle):
        try:
            fn()
        except UserError as e:
            assert needle in str(e), str(e)
            seen.append(str(e))
            return
        raise AssertionError(f"no UserError for {needle}")

    expect(lambda: make_cp_attention(None, impl="bogus"), "parallel.cp_impl")
    expect(lambda: make_cp_attention(None, impl="hybrid", ulysses_size=3), "parallel.ulysses_size=3")
    uly = make_cp_attention(None, impl="ulysses")
    q, k = torch.randn(1, 3, 4, 8), torch.randn(1, 1, 4, 8)
    expect(lambda: uly(q, k, k), "parallel.ulysses_size=2 must divide the number of attention heads (3)")
    ring = make_cp_attention(None, impl="ring")
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    expect(lambda: ring(q, k, k), "data.seq_len=10 must be divisible by 2*parallel.cp_size=4")
    expect(lambda: shard_batch({"input_ids": torch.zeros(1, 10, dtype=torch.long)}, rank, world), "data.seq_len=10")
    # the group is still usable: a valid call after the errors completes on both ranks
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 8, 8, generator=g), torch.randn(1, 2, 8, 8, generator=g)
    ql, kl = shard_sequence(q, rank, world, dim=2), shard_sequence(k, rank, world, dim=2)
    out = ring(ql, kl, kl)
    # gather_sequence reassembles the natural order; it equals attention on the whole sequence
    full = gather_sequence(out, None, dim=2)
    assert (full - eager_attention(q, k, k)).abs().max() < 1e-5
    # a CP group of size 1 (each rank alone) is plain local attention
    singles = [dist.new_group([r]) for r in range(world)]
    alone = make_cp_attention(singles[rank], impl="ring")
    assert (alone(q, k, k) - eager_attention(q, k, k)).abs().max() < 1e-5
    return seen


def test_errors_raise_before_any_collective():
    results = run_distributed(_errors_worker, 2, timeout=120)
    assert all(len(r) == 5 for r in results)


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
    full = {"input_ids": ids, "labels": labels, "segment_ids": seg, "loss_weights": torch.arange(8.)[None], "note": "kept"}
    local = shard_batch(full, 1, 2)
    assert local["input_ids"].tolist() == [[102, 103, 104, 105]]
    assert local["labels"].tolist() == [[103, 104, 105, 106]]  # targets stay with their inputs
    assert local["position_ids"].tolist() == [[2, 0, 1, 0]]  # global, restarting per document
    assert local["segment_ids"].tolist() == [[0, 1, 1, 2]] and local["note"] == "kept"
    assert local["loss_weights"].tolist() == [[2.0, 3.0, 4.0, 5.0]]
    plain = shard_batch({"input_ids": ids}, 0, 2)
    assert plain["position_ids"].tolist() == [[0, 1, 6, 7]]
