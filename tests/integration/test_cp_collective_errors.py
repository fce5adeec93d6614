"""Bad CP input on a real process group: every rank raises one clear UserError before any
collective, and the group stays usable afterwards."""
import torch
import torch.distributed as dist

from helpers.cp import run_distributed
from longctx.attention import eager_attention
from longctx.base.errors import UserError
from longctx.parallel import gather_sequence, make_cp_attention, shard_batch, shard_sequence


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
    q, k = torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8)
    expect(lambda: uly(q, k, k), "parallel.ulysses_size=2 (cp_impl ulysses: parallel.cp_size) exceeds the number "
                                 "of attention heads (1)")
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
