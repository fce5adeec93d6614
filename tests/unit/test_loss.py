"""Chunked cross-entropy: same loss and gradients as the plain one, far less memory."""
import pytest
import torch
import torch.nn.functional as F
from bench_loss import measure  # the benchmark's subprocess measurement of peak RSS (benchmarks/ on pythonpath)

from helpers.model import tiny_model
from longctx.model import loss as loss_module
from longctx.model.loss import chunked_cross_entropy


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("weighted", [False, True])
def test_chunked_matches_plain(dtype, tol, weighted):
    g = torch.Generator().manual_seed(0)
    N, d, V = 300, 32, 1000
    h = torch.randn(N, d, generator=g).to(dtype).requires_grad_()
    W = (0.1 * torch.randn(V, d, generator=g)).to(dtype).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g)
    y[::7] = -100
    tw = torch.rand(N, generator=g) + 0.5 if weighted else None
    loss_sum, wsum = chunked_cross_entropy(h, W, y, tw, chunk_size=64)
    (loss_sum / wsum).backward()
    gh, gW = h.grad.clone(), W.grad.clone()
    h.grad = W.grad = None
    per_tok = F.cross_entropy((h @ W.t()).float(), y, ignore_index=-100, reduction="none")
    weights = (y != -100).float() * (tw if weighted else 1.0)
    ref = (per_tok * weights).sum() / weights.sum()
    ref.backward()
    assert torch.allclose(loss_sum / wsum, ref, rtol=tol, atol=tol)
    assert (gh.float() - h.grad.float()).abs().max() <= tol * max(1.0, h.grad.float().abs().max().item())
    assert (gW.float() - W.grad.float()).abs().max() <= tol * max(1.0, W.grad.float().abs().max().item())


def test_model_loss_path_matches_logits_path():
    model = tiny_model("default", "gqa")
    ids = torch.randint(0, 128, (2, 40))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = -100
    loss_sum, n = model(ids, labels=labels, loss_chunk_size=17)
    (loss_sum / n).backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    ref = F.cross_entropy(model(ids).flatten(0, 1), labels.flatten(), ignore_index=-100)
    ref.backward()
    assert torch.allclose(loss_sum / n, ref, rtol=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(grads[k], p.grad, rtol=1e-4, atol=1e-6), k


def test_no_grad_path_skips_gradient_work_and_gives_the_same_loss(monkeypatch):
    h, W = torch.randn(10, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    y = torch.randint(0, 50, (10,))
    calls = []
    real = loss_module._accumulate_grads
    monkeypatch.setattr(loss_module, "_accumulate_grads", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        s, n = chunked_cross_entropy(h, W, y, chunk_size=3)
    assert calls == []  # no gradient GEMMs when nothing will call backward
    s_grad, n_grad = chunked_cross_entropy(h, W, y, chunk_size=3)
    assert len(calls) == 4  # one per chunk of 3 rows (10 rows)
    assert s.grad_fn is None and not s.requires_grad and s_grad.requires_grad
    assert n.item() == n_grad.item() == 10
    torch.testing.assert_close(s, s_grad.detach(), rtol=1e-6, atol=0)


def test_chunked_loss_peak_memory_is_a_fraction_of_plain():
    """Subprocess RSS growth of loss forward+backward (4k tokens x 32k vocab, fp32)."""
    plain = measure("plain", 4096, 32000, 256)
    chunked = measure("chunked", 4096, 32000, 256, chunk=512)
    assert abs(plain["loss"] - chunked["loss"]) <= 1e-5 * plain["loss"]
    assert chunked["peak_growth_gb"] <= 0.25 * plain["peak_growth_gb"], (chunked, plain)


def test_chunked_loss_holds_one_chunk_of_logits_at_a_time():
    """bf16, 8192 tokens x 32k vocab in chunks of 2048: the peak is one chunk's fp32 logits
    (250 MiB) plus the head-sized gradients and row-block temporaries, not two chunks."""
    tokens, vocab, hidden, chunk = 8192, 32000, 256, 2048
    chunked = measure("chunked", tokens, vocab, hidden, "bfloat16", chunk=chunk)
    chunk_logits_gb = chunk * vocab * 4 / 2**30
    head_fp32_gb = vocab * hidden * 4 / 2**30
    assert chunked["peak_growth_gb"] <= 1.3 * chunk_logits_gb + 3 * head_fp32_gb, chunked
