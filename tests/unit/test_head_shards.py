"""The head split of a Ulysses group (parallel/heads.py): uneven query ranges, the kv heads they
use, the kernel runs and backward rounds, and the automatic Ulysses degree."""
import dataclasses

import pytest

from longctx.model import ModelConfig, get_preset
from longctx.parallel.heads import HeadShards, auto_ulysses_size
from longctx.plan import Layout, estimate_layout, relative_time_per_token
from longctx.plan.activations import activation_bytes


def test_smollm2_heads_at_cp2_and_cp4():
    s = HeadShards(9, 3, 2)
    assert not s.even and s.q_ranges() == [(0, 5), (5, 9)] and s.kv_ranges() == [(0, 2), (1, 3)]
    assert s.runs(0) == [(0, 3, 0, 1), (3, 5, 1, 2)] and s.runs(1) == [(5, 6, 1, 2), (6, 9, 2, 3)]
    assert s.max_heads == 5 and s.max_kv_heads == 2 and s.rounds() == 2 and s.waste == pytest.approx(10 / 9)
    s4 = HeadShards(9, 3, 4)
    assert s4.q_ranges() == [(0, 3), (3, 5), (5, 7), (7, 9)] and s4.kv_ranges() == [(0, 1), (1, 2), (1, 3), (2, 3)]
    assert s4.waste == pytest.approx(12 / 9)


@pytest.mark.parametrize("H, Hkv, U", [(9, 3, 2), (9, 3, 4), (12, 6, 4), (6, 2, 4), (3, 1, 2), (32, 8, 3),
                                       (8, 4, 2), (8, 1, 4), (5, 5, 5)])
def test_every_query_head_once_with_its_kv_head(H, Hkv, U):
    s = HeadShards(H, Hkv, U)
    assert [h for lo, hi in s.q_ranges() for h in range(lo, hi)] == list(range(H))
    assert max(hi - lo for lo, hi in s.q_ranges()) - min(hi - lo for lo, hi in s.q_ranges()) <= 1
    for u in range(U):
        for calls in (s.runs(u), s.calls(u)):
            assert [h for a, b, _, _ in calls for h in range(a, b)] == list(range(*s.q_range(u)))
            for qa, qb, ka, kb in calls:  # one uniform GQA call: its queries use exactly these kv heads
                assert sorted({h // s.group for h in range(qa, qb)}) == list(range(ka, kb))
                assert (qb - qa) % (kb - ka) == 0
        assert all(kb - ka == 1 for _, _, ka, kb in s.runs(u))  # backward rounds: one kv head each


def test_even_is_the_fast_paths_rule():
    assert HeadShards(8, 4, 2).even and HeadShards(8, 1, 4).even and HeadShards(32, 8, 8).even
    assert not HeadShards(12, 6, 4).even and not HeadShards(9, 3, 2).even


def test_auto_ulysses_size():
    assert auto_ulysses_size(4, 8, 4) == 4  # even: the largest
    assert auto_ulysses_size(8, 12, 4) == 4  # even 4 x ring 2 before an uneven 8 (waste 16/12)
    assert auto_ulysses_size(2, 9, 3) == 2  # uneven, waste 10/9
    assert auto_ulysses_size(4, 9, 3) == 2  # uneven 4 wastes 12/9 > 1.25: 2 x ring 2
    assert auto_ulysses_size(4, 2, 2) == 2  # never more members than query heads
    assert auto_ulysses_size(4, 1, 1) == 1  # plain ring


def test_planner_charges_uneven_shards():
    """Uneven shards cost the busiest member's attention (time) and its larger head-sharded
    buffers (memory); an even split's estimate is unchanged by the rule."""

    m = ModelConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=16384,
                    rope_parameters={"rope_type": "default", "rope_theta": 100000.0})
    base = Layout(seq_len=16384, world_size=2, cp_size=2, cp_impl="ring", ulysses_size=1, zero_stage=1,
                  offload_optimizer=False, offload_params=False, activation_checkpointing="full", checkpoint_every=1,
                  recompute_attention=False, micro_batch_size=1, grad_accum=1, dtype="bfloat16", loss_chunk_size=1024,
                  attention_backend="sdpa")
    uly = dataclasses.replace(base, cp_impl="ulysses")
    assert relative_time_per_token(m, uly) > relative_time_per_token(m, base)
    ring_est, uly_est = (estimate_layout(m, lay, device="cpu") for lay in (base, uly))
    assert uly_est.peak > 0 and ring_est.peak > 0
    even = dataclasses.replace(m, num_attention_heads=8, num_key_value_heads=4, head_dim=72)
    assert relative_time_per_token(even, dataclasses.replace(uly)) == relative_time_per_token(even, base)
    t, q, kv = 8192, 9 * 64, 3 * 64  # local tokens; query / kv widths
    # member 0 of 2 attends 5 of 9 query heads with 2 of 3 kv heads (kv head 1 sent to both)
    assert activation_bytes(m, uly, "cpu")["comm_fwd"] == 2 * t * (2 * int(q * 10 / 9) + 2 * int(kv * 4 / 3)) * 2


def test_qwen25_7b_heads_at_ulysses_8_and_the_plan_at_128k():
    """Qwen2.5-7B's 28 query / 4 kv heads at Ulysses 8 (where an even split is refused elsewhere):
    members take 4 or 3 query heads and the one or two kv heads those use; the planner charges
    the busiest member and the layout fits 8 x 80 GB at 128k."""
    s = HeadShards(28, 4, 8)
    assert not s.even and [hi - lo for lo, hi in s.q_ranges()] == [4, 4, 4, 4, 3, 3, 3, 3]
    assert s.kv_ranges() == [(0, 1), (0, 2), (1, 2), (1, 3), (2, 3), (2, 4), (3, 4), (3, 4)]
    assert s.max_heads == 4 and s.max_kv_heads == 2 and s.waste == pytest.approx(32 / 28)
    assert auto_ulysses_size(8, 28, 4) == 4  # hybrid's own choice: 4 x ring 2 (an even 7 heads each)
    m = get_preset("qwen2.5-7b", max_position_embeddings=131072)
    lay = Layout(seq_len=131072, world_size=8, cp_size=8, cp_impl="ulysses", ulysses_size=1, zero_stage=3,
                 offload_optimizer=False, offload_params=False, activation_checkpointing="full", checkpoint_every=1,
                 recompute_attention=False, micro_batch_size=1, grad_accum=8, dtype="bfloat16", loss_chunk_size=1024,
                 attention_backend="auto")
    ring = dataclasses.replace(lay, cp_impl="ring")
    assert estimate_layout(m, lay).fits(80 * 2**30) and estimate_layout(m, ring).fits(80 * 2**30)
    assert relative_time_per_token(m, lay) > relative_time_per_token(m, ring)  # the busiest member's 4 heads of 3.5
