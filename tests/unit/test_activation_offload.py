"""Checkpointed block inputs offloaded to host buffers or a per-rank file (parallel/activation_offload.py):
losses and gradients are bit-identical to checkpointing without offload on both model paths, the
inputs really leave (the forward holds fewer bytes; the file receives them), the next block's
input is prefetched, slots are reused, and a killed run's file is removed by the next one."""
import os
import socket

import pytest
import torch

from helpers.auto_models import tiny_auto_model
from helpers.memory import HeldStorages, held_bytes
from helpers.model import loss_and_grads, tiny_model
from longctx.parallel.activation_offload import offload_for
from longctx.parallel.checkpointing import apply_activation_checkpointing
from longctx.parallel.offload_stores import (
    DiskStore,
    HostStore,
    remove_stale,
)

CPU = torch.device("cpu")


def _batch(seed=0, T=64, vocab=128):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (2, T), generator=g)
    segs = (torch.arange(T) >= 20).long().expand(2, T).contiguous()  # two packed documents
    return ids, torch.roll(ids, -1, 1), segs


def _checkpointed(build, policy, offload=None):
    model = build()
    apply_activation_checkpointing(model, policy, every=2,
                                   checkpoint_fn=None if offload is None else offload.checkpoint_fn)
    return model


def _assert_identical(ref, got):
    (ref_loss, ref_grads), (loss, grads) = ref, got
    assert loss == ref_loss
    assert ref_grads.keys() == grads.keys()
    for k, g in ref_grads.items():
        assert torch.equal(grads[k], g), k


@pytest.mark.parametrize("mode", ["host", "disk"])
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_native_model_bit_identical(mode, policy, tmp_path):
    ids, labels, segs = _batch()
    build = lambda: tiny_model("yarn", "gqa", num_hidden_layers=3)  # noqa: E731
    ref = loss_and_grads(_checkpointed(build, policy), ids, labels, segs)
    offload = offload_for(mode, CPU, tmp_path, rank=0)
    model = _checkpointed(build, policy, offload)
    for _ in range(2):  # the second step reuses the slots (and the file from offset 0)
        _assert_identical(ref, loss_and_grads(model, ids, labels, segs))
    stats = offload.store.stats
    wrapped = 3 if policy == "full" else 2
    assert stats["put"] == stats["get"] == 2 * wrapped
    assert stats["prefetched"] == (2 * (wrapped - 1) if mode == "disk" else 0)
    assert not offload.store.entries and offload.store.live_bytes == 0
    block_input = 2 * 64 * model.config.hidden_size * 4  # (B, T, d) fp32, a page multiple
    assert stats["peak_live_bytes"] == wrapped * block_input
    if mode == "disk":
        assert offload.store.end == 0 and offload.store.file_peak == wrapped * block_input
    offload.close()


def test_transformers_path_bit_identical(tmp_path):
    ids, labels, segs = _batch(vocab=96)
    build = lambda: tiny_auto_model("qwen3_moe")  # noqa: E731
    ref = loss_and_grads(_checkpointed(build, "full"), ids, labels, segs)
    offload = offload_for("disk", CPU, tmp_path, rank=3)
    _assert_identical(ref, loss_and_grads(_checkpointed(build, "full", offload), ids, labels, segs))
    assert offload.store.stats["put"] == 2
    offload.close()


def test_forward_holds_fewer_bytes(tmp_path):
    """The bytes the forward leaves held: disk offload holds less than checkpointing alone by about
    the block inputs (the written copies are in the file, not in this process)."""
    ids, labels, _ = _batch()
    build = lambda: tiny_model("yarn", "gqa", num_hidden_layers=4)  # noqa: E731
    plain = held_bytes(_checkpointed(build, "full"), ids, labels=labels)
    offload = offload_for("disk", CPU, tmp_path, rank=0)
    model = _checkpointed(build, "full", offload)
    with HeldStorages() as mode:
        result = model(ids, labels=labels)
        offload.store.io.submit(lambda: None).result()  # every write has finished
    offloaded = mode.held_bytes()
    del result
    inputs = 4 * 2 * 64 * build().config.hidden_size * 4  # layers x (B, T, d) fp32
    assert plain - offloaded >= inputs * 3 // 4, (plain, offloaded)
    offload.close()


def test_no_grad_forward_packs_nothing(tmp_path):
    ids, _, _ = _batch()
    offload = offload_for("host", CPU, tmp_path, rank=0)
    model = _checkpointed(lambda: tiny_model(num_hidden_layers=2), "full", offload)
    with torch.no_grad():
        model(ids)
    assert offload.store.stats["put"] == 0


def test_forward_without_backward_releases_slots(tmp_path):
    """A graph dropped without a backward (an exception between forward and backward) frees its
    slots: the file's space is reused from 0 by the next step."""
    ids, labels, segs = _batch()
    offload = offload_for("disk", CPU, tmp_path, rank=0)
    model = _checkpointed(lambda: tiny_model(num_hidden_layers=2), "full", offload)
    s, n = model(ids, labels=labels, segment_ids=segs)
    assert len(offload.store.entries) == 2
    del s, n
    assert not offload.store.entries and offload.store.end == 0
    offload.close()


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_store_round_trip_dtypes(kind, tmp_path):
    """Every byte comes back (bf16 and a size that is not a page multiple), in LIFO order with
    prefetch, and a second restore of one slot is refused in one line."""
    store = HostStore(CPU) if kind == "host" else DiskStore(CPU, tmp_path, rank=1)
    tensors = [torch.randn(3, 5, 7).to(torch.bfloat16), torch.randn(4, 1000), torch.randn(2, 3)]
    handles = [store.put(t) for t in tensors]
    for t, h in reversed(list(zip(tensors, handles))):
        back = store.get(h)
        assert back.dtype == t.dtype and back.shape == t.shape and torch.equal(back, t)
    with pytest.raises(RuntimeError, match="already restored"):
        store.get(handles[0])
    store.close()


def test_disk_file_is_gone_while_running_and_after(tmp_path):
    store = DiskStore(CPU, tmp_path, rank=0)
    store.get(store.put(torch.randn(1000)))
    assert list(tmp_path.iterdir()) == []  # unlinked once open: a kill leaves nothing behind
    store.close()
    assert list(tmp_path.iterdir()) == []


def test_stale_files_of_dead_owners_are_removed(tmp_path):
    host = socket.gethostname()
    dead = tmp_path / f"activations-rank0-{2**22 + 12345}-1@{host}.bin"  # a pid beyond pid_max
    live = tmp_path / f"activations-rank1-{os.getpid()}-x@{host}.bin"
    elsewhere = tmp_path / f"activations-rank0-{2**22 + 12345}-1@not-{host}.bin"
    mine = tmp_path / "notes.bin"
    for p in (dead, live, elsewhere, mine):
        p.write_bytes(b"x" * 10)
    assert remove_stale(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, elsewhere.name, mine.name])
    DiskStore(CPU, tmp_path, rank=0).close()  # a new run sweeps the folder it uses the same way
    assert dead not in list(tmp_path.iterdir())


def _adapter_loss_and_grads(model, ids, labels, segs):
    """loss_and_grads for a model with frozen weights: the gradients of what trains only, and
    every frozen weight without one."""
    s, n = model(ids, labels=labels, segment_ids=segs)
    (s / n).backward()
    frozen = [k for k, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(p.grad is None for p in model.parameters() if not p.requires_grad)
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return (s / n).item(), grads


@pytest.mark.parametrize("path", ["native", "transformers"])
def test_adapter_runs_bit_identical(path, tmp_path):
    """LoRA with trainable embeddings and norms (train.adapter): the offloaded block input is the
    one the adapter's factors are trained from, so their gradients are the same bits."""
    pytest.importorskip("peft")
    from longctx.config.adapter import AdapterSection
    from longctx.model.adapter import apply_adapter

    adapter = AdapterSection(r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "up_proj"],
                             trainable=["embed_tokens", "norm"])

    def build():
        base = tiny_model("yarn", "gqa", num_hidden_layers=3) if path == "native" else tiny_auto_model("olmo2")
        model = apply_adapter(base, adapter, seed=0)
        with torch.no_grad():  # B starts at zero: give every factor a gradient
            for name, p in model.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
        return model

    ids, labels, segs = _batch(vocab=96)
    ref = _adapter_loss_and_grads(_checkpointed(build, "full"), ids, labels, segs)
    assert any(".lora_A." in k for k in ref[1])
    offload = offload_for("disk", CPU, tmp_path, rank=0)
    _assert_identical(ref, _adapter_loss_and_grads(_checkpointed(build, "full", offload), ids, labels, segs))
    assert offload.store.stats["put"] > 0
    offload.close()
