"""LoRA + trainable embeddings and norms under every layout of a 2-rank and a 4-rank gloo
group, on both model paths (one spawned group per world size runs every case:
tests/helpers/adapter_layouts.py)."""
from helpers.adapter_layouts import worker
from helpers.cp import check_all, run_distributed

CASES = [
    ("native", "ring-zero0-packed", dict(cp_size=2, cp_impl="ring", zero_stage=0)),
    ("native", "allgather-zero1-ckpt", dict(cp_size=2, cp_impl="allgather", zero_stage=1,
                                            activation_checkpointing="full")),
    # the MLP in tiles of 16 tokens (2 rows x 32 local tokens: 4 tiles), LoRA on its projections
    ("native", "ulysses-zero2-tiled-ckpt", dict(cp_size=2, cp_impl="ulysses", zero_stage=2, mlp_tile_tokens=16,
                                                activation_checkpointing="selective")),
    ("native", "hybrid-zero3", dict(cp_size=2, cp_impl="hybrid", ulysses_size=1, zero_stage=3)),
    ("native", "dp2-zero2-tiled", dict(cp_size=1, zero_stage=2, mlp_tile_tokens=16)),
    ("auto", "ring-zero3", dict(cp_size=2, cp_impl="ring", zero_stage=3)),
    ("auto", "ulysses-zero1-ckpt", dict(cp_size=2, cp_impl="ulysses", zero_stage=1,
                                        activation_checkpointing="full")),
]

# cp 4: 16 local tokens per row, every shard cut by a document boundary; tiles of 8 tokens (2 rows
# x 16 local tokens: 4 tiles); Ulysses 4 over 2 kv heads replicates them; the hybrid is ring 2 x
# Ulysses 2; dp 2 x cp 2 as well
CASES_4 = [
    ("native", "cp4-ring-zero0-tiled-ckpt", dict(cp_size=4, cp_impl="ring", zero_stage=0, mlp_tile_tokens=8,
                                                 activation_checkpointing="full")),
    ("native", "cp4-allgather-zero1-tiled-ckpt", dict(cp_size=4, cp_impl="allgather", zero_stage=1, mlp_tile_tokens=8,
                                                      activation_checkpointing="selective", checkpoint_every=1)),
    ("native", "cp4-ulysses-zero3-ckpt", dict(cp_size=4, cp_impl="ulysses", zero_stage=3,
                                              activation_checkpointing="full")),
    ("native", "cp4-hybrid2x2-zero2-tiled-ckpt", dict(cp_size=4, cp_impl="hybrid", ulysses_size=2, zero_stage=2,
                                                      mlp_tile_tokens=8, activation_checkpointing="full")),
    ("native", "dp2-cp2-ring-zero3-ckpt", dict(cp_size=2, cp_impl="ring", zero_stage=3,
                                               activation_checkpointing="selective")),
    ("auto", "cp4-hybrid2x2-zero3-ckpt", dict(cp_size=4, cp_impl="hybrid", ulysses_size=2, zero_stage=3,
                                              activation_checkpointing="full")),
]


def test_adapter_training_equals_one_process_under_every_layout():
    results = run_distributed(worker, 2, CASES, timeout=400)
    check_all(results, min_checks=4 * len(CASES))


def test_adapter_training_equals_one_process_at_cp4_and_a_ring_ulysses_hybrid():
    results = run_distributed(worker, 4, CASES_4, timeout=400)
    check_all(results, min_checks=4 * len(CASES_4))
