"""The two-way trainer benchmarks (benchmarks/bench_offload.py, bench_adapter.py) predict with the
planner for exactly the configuration they train: the overrides that make a run an offload or an
adapter run reach the prediction, and each one lowers the peak and lengthens the longest sequence
in a budget the way its report says."""
from __future__ import annotations

import bench_adapter
import bench_offload
from benchlib.trainer_runs import predict, with_length

DEEP = ["model.overrides.num_hidden_layers=16", "model.overrides.hidden_size=256",
        "model.overrides.intermediate_size=688", "model.overrides.num_attention_heads=4",
        "model.overrides.num_key_value_heads=2"]


def test_the_run_and_the_prediction_read_the_same_length_and_steps():
    args = with_length(["model.preset=bench-44m"], 20480, 3)
    assert args[-3:] == ["data.seq_len=20480", "model.max_position_embeddings=20480", "train.steps=3"]


def test_disk_offload_lowers_the_predicted_activations_and_lengthens_the_longest():
    base = [*bench_offload.SETTINGS, *DEEP]
    none = predict([*base, "parallel.offload_activations=none"], 32768, 1.5)
    disk = predict([*base, "parallel.offload_activations=disk"], 32768, 1.5)
    # 16 block inputs of 16,384 tokens x 256 fp32 per rank, of which the device keeps 2
    assert none["breakdown_gib"]["activations"] > 2 * disk["breakdown_gib"]["activations"]
    assert disk["predicted_gib"] < none["predicted_gib"]
    assert disk["predicted_longest"] > 1.2 * none["predicted_longest"]


def test_an_adapter_keeps_no_gradients_or_optimizer_state_for_frozen_weights():
    full = predict([*bench_adapter.SETTINGS], 16384, 1.5)
    adapter = predict([*bench_adapter.SETTINGS, *bench_adapter.RUNS["adapter"]], 16384, 1.5)
    assert adapter["breakdown_gib"].get("gradients", 0.0) < full["breakdown_gib"]["gradients"]
    assert adapter["breakdown_gib"]["optimizer"] < 0.5 * full["breakdown_gib"]["optimizer"]
    assert adapter["breakdown_gib"]["activations"] == full["breakdown_gib"]["activations"]
    assert adapter["predicted_longest"] > full["predicted_longest"]
