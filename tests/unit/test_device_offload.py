"""Activation offload on an accelerator (parallel/activation_offload.py's CUDA path: pinned host
buffers, the side stream, the prefetch): bit-identical losses and gradients to checkpointing
without offload in fp32 and bf16, and fewer bytes held on the device after the forward.

Skipped unless CUDA is available (CI has none); `LONGCTX_TEST_DEVICE=cpu` runs the same checks on
CPU (as tests/unit/test_device.py does)."""
import os

import pytest
import torch

from helpers.model import tiny_config, tiny_model
from longctx.parallel.activation_offload import offload_for
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key

DEVICE = os.environ.get("LONGCTX_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="no CUDA device (set LONGCTX_TEST_DEVICE to force one)")
LAYERS, T = 4, 256


def _run(mode, dtype, folder):
    device = torch.device(DEVICE)
    model = tiny_model("llama3", "gqa", num_hidden_layers=LAYERS).to(device=device, dtype=dtype)
    offload = offload_for(mode, device, folder, rank=0)
    apply_activation_checkpointing(model, "full", checkpoint_fn=None if offload is None else offload.checkpoint_fn)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 128, (2, T), generator=g).to(device)
    labels = torch.roll(ids, -1, 1)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    s, n = model(ids, labels=labels)
    held = torch.cuda.memory_allocated() - before if device.type == "cuda" else 0
    (s / n).backward()
    grads = {model_key(k): p.grad.detach().cpu() for k, p in model.named_parameters()}
    stats = None if offload is None else dict(offload.store.stats)
    if offload is not None:
        offload.close()
    return (s / n).item(), grads, held, stats


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("mode", ["host", "disk"])
def test_offload_on_device_is_bit_identical_and_holds_less(mode, dtype, tmp_path):
    ref_loss, ref_grads, ref_held, _ = _run("none", dtype, tmp_path)
    loss, grads, held, stats = _run(mode, dtype, tmp_path)
    assert loss == ref_loss
    for k, g in ref_grads.items():
        assert torch.equal(grads[k], g), k
    assert stats["put"] == stats["get"] == LAYERS
    # every block but the first brings the next one's input back early (host on CPU: a plain copy in get)
    assert stats["prefetched"] == (0 if (DEVICE == "cpu" and mode == "host") else LAYERS - 1)
    if DEVICE == "cuda":  # the forward leaves at least L - 2 block inputs (B, T, d) fewer on the device
        block_input = 2 * T * tiny_config("llama3", "gqa").hidden_size * dtype.itemsize
        assert ref_held - held >= (LAYERS - 2) * block_input, (ref_held, held)
    assert list(tmp_path.iterdir()) == []
