"""LoRA + trainable embeddings and norms under every layout of a 2-rank gloo group, on both
model paths (one spawned group runs every case: tests/helpers/adapter_layouts.py)."""
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


def test_adapter_training_equals_one_process_under_every_layout():
    results = run_distributed(worker, 2, CASES, timeout=400)
    check_all(results, min_checks=4 * len(CASES))
