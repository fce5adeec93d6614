"""Chunked cross-entropy: same loss and gradients as the plain one (its memory, measured in
processes: tests/integration/test_loss_memory.py)."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.model import tiny_model
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


class GemmFlops(TorchDispatchMode):
    """Counts 2*m*k*n for every matrix product the code runs (aten mm, addmm and in-place addmm_)."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            a, b = args[-2], args[-1]  # (m, k) @ (k, n); addmm's beta/alpha are keywords
            self.flops += 2 * a.shape[0] * a.shape[1] * b.shape[1]
        return func(*args, **(kwargs or {}))


def test_no_grad_path_skips_gradient_work_and_gives_the_same_loss():
    """Without grad only the logits' GEMMs run (2*N*d*V); with grad the hidden-state and head
    gradients run in the forward too, as many FLOPs again each (a plain head's forward+backward)."""
    N, d, V = 10, 8, 50
    h, W = torch.randn(N, d, requires_grad=True), torch.randn(V, d, requires_grad=True)
    y = torch.randint(0, V, (N,))
    with torch.no_grad(), GemmFlops() as no_grad:
        s, n = chunked_cross_entropy(h, W, y, chunk_size=3)
    with GemmFlops() as with_grad:
        s_grad, n_grad = chunked_cross_entropy(h, W, y, chunk_size=3)
    assert no_grad.flops == 2 * N * d * V  # no gradient GEMMs when nothing will call backward
    assert with_grad.flops == 3 * 2 * N * d * V
    assert s.grad_fn is None and not s.requires_grad and s_grad.requires_grad
    assert n.item() == n_grad.item() == N
    torch.testing.assert_close(s, s_grad.detach(), rtol=1e-6, atol=0)


def test_position_buckets_sum_the_token_losses_and_leave_the_gradients_alone():
    """The (2, K) loss / weight sums by bucket are the plain per-token losses grouped; the
    scalar loss and the gradients are bit-identical to the call without buckets."""
    g = torch.Generator().manual_seed(1)
    N, d, V, K = 200, 16, 300, 4
    h = torch.randn(N, d, generator=g).requires_grad_()
    W = (0.1 * torch.randn(V, d, generator=g)).requires_grad_()
    y = torch.randint(0, V, (N,), generator=g)
    y[::5] = -100
    tw = torch.rand(N, generator=g) + 0.5
    b = torch.randint(0, K - 1, (N,), generator=g)  # the last bucket stays empty
    loss, wsum, by_bucket = chunked_cross_entropy(h, W, y, tw, chunk_size=48, buckets=b, n_buckets=K)
    loss.backward()
    gh, gW = h.grad.clone(), W.grad.clone()
    h.grad = W.grad = None
    plain, plain_w = chunked_cross_entropy(h, W, y, tw, chunk_size=48)
    plain.backward()
    assert torch.equal(loss, plain) and torch.equal(wsum, plain_w)
    assert torch.equal(gh, h.grad) and torch.equal(gW, W.grad)
    per_tok = F.cross_entropy(h.detach() @ W.detach().t(), y, ignore_index=-100, reduction="none")
    w = (y != -100).float() * tw
    ref = torch.stack([torch.stack([(per_tok * w)[b == k].sum(), w[b == k].sum()]) for k in range(K)], 1)  # (2, K)
    assert by_bucket.shape == (2, K) and not by_bucket.requires_grad
    assert torch.allclose(by_bucket, ref, rtol=1e-5, atol=1e-4)
    assert by_bucket[:, -1].abs().sum() == 0


def test_model_buckets_by_the_position_id_of_the_predicting_token():
    model = tiny_model("default", "gqa")
    ids = torch.randint(0, 128, (2, 40))
    labels = torch.roll(ids, -1, 1)
    labels[:, -1] = -100
    pos = torch.cat([torch.arange(25), torch.arange(15)]).expand(2, 40)  # two packed documents
    ends = torch.tensor([8, 16, 40])
    loss, n, by_bucket = model(ids, position_ids=pos, labels=labels, loss_chunk_size=17, loss_buckets=ends)
    counts = [((pos < 8) & (labels != -100)).sum(), ((pos >= 8) & (pos < 16) & (labels != -100)).sum(),
              ((pos >= 16) & (labels != -100)).sum()]
    assert by_bucket[1].tolist() == [float(c) for c in counts]
    assert torch.allclose(by_bucket[0].sum(), loss) and by_bucket[1].sum() == n
