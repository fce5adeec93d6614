"""Thread-balanced CPU flash backward (longctx/attention/balanced.py): the same gradients as one
call of the kernel, with every call's work items dividing among the threads."""
import pytest
import torch

from longctx.attention.balanced import MIN_PIECE_ROWS, balanced_backward, thread_share
from longctx.attention.sdpa import SdpaKernel

_aten = torch.ops.aten
SCALE = 0.125


def _inputs(B, Hq, Hkv, T, S, dtype, causal, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, 64, generator=g).to(dtype)
    k, v = (torch.randn(B, Hkv, S, 64, generator=g).to(dtype) for _ in range(2))
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=SCALE)
    dout = torch.randn(out.shape, generator=g).to(dtype)
    return dout, q, k, v, out, lse


class Recorder:
    """The kernel's backward, recording each call's work items (batch rows x kv heads) and rows."""

    def __init__(self):
        self.calls = []

    def __call__(self, dout, q, k, v, out, lse, is_causal):
        self.calls.append((q.shape[0] * k.shape[1], q.shape[2], is_causal))
        return _aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, is_causal, scale=SCALE)


def _plain(dout, q, k, v, out, lse, causal):
    return _aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal,
                                                                       scale=SCALE)


def _assert_close(got, want, tolerance):
    """Same shapes and dtypes; max |difference| <= tolerance * max |want|, per gradient."""
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        err = ((g.float() - w.float()).abs().max() / w.float().abs().max()).item()
        assert err <= tolerance, f"{name}: relative max difference {err:.2e}"


def test_thread_share():
    assert thread_share(3, 2) == 0.75  # 3 kv heads on 2 threads: one idles a third of the time
    assert thread_share(6, 2) == thread_share(3, 3) == thread_share(3, 1) == 1.0
    assert thread_share(9, 2) == 0.9
    assert thread_share(3, 4) == 0.75


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("B,Hq,Hkv", [(1, 9, 3), (1, 9, 9), (2, 6, 3), (1, 4, 1)])
def test_gradients_equal_one_call_fp32(threads, causal, B, Hq, Hkv):
    T = 6 * MIN_PIECE_ROWS  # divides into 2, 3 and 4 pieces
    args = _inputs(B, Hq, Hkv, T, T, torch.float32, causal, seed=threads)
    want = _plain(*args, causal)
    rec = Recorder()
    got = balanced_backward(rec, *args, is_causal=causal, threads=threads)
    _assert_close(got, want, 1e-6)
    if thread_share(B * Hkv, threads) >= 0.95:
        assert rec.calls == [(B * Hkv, T, causal)], "a balanced call stays whole"
    else:
        assert any(items > B * Hkv for items, _, _ in rec.calls), "an unbalanced call is split"


def test_smollm2_shape_on_two_threads_runs_balanced_calls():
    """9 query / 3 kv heads, one row, two threads: the diagonal halves as one call of 6 items,
    the off-diagonal block's two query pieces as another."""
    T = 4 * MIN_PIECE_ROWS
    args = _inputs(1, 9, 3, T, T, torch.float32, True)
    rec = Recorder()
    got = balanced_backward(rec, *args, is_causal=True, threads=2)
    assert rec.calls == [(6, T // 2, True), (6, T // 4, False)]
    _assert_close(got, _plain(*args, True), 1e-6)


def test_pieces_stop_at_their_smallest_size():
    """Two threads, T = 2 * MIN_PIECE_ROWS: the off-diagonal block cannot be cut again."""
    T = 2 * MIN_PIECE_ROWS
    rec = Recorder()
    balanced_backward(rec, *_inputs(1, 9, 3, T, T, torch.float32, True), is_causal=True, threads=2)
    assert rec.calls == [(6, T // 2, True), (3, T // 2, False)]


def test_bf16_within_one_rounding_of_one_call():
    T = 2 * MIN_PIECE_ROWS
    args = _inputs(1, 9, 3, T, T, torch.bfloat16, True)
    want = _plain(*args, True)
    got = balanced_backward(Recorder(), *args, is_causal=True, threads=2)
    _assert_close(got, want, 1e-2)


@pytest.mark.parametrize("T", [2 * MIN_PIECE_ROWS - 2, 2 * MIN_PIECE_ROWS + 1])
def test_short_or_odd_blocks_stay_one_call(T):
    args = _inputs(1, 9, 3, T, T, torch.float32, True)
    rec = Recorder()
    got = balanced_backward(rec, *args, is_causal=True, threads=2)
    assert len(rec.calls) == 1
    for w, g in zip(_plain(*args, True), got):
        assert torch.equal(g, w)


def test_unmasked_rectangular_block():
    """An unmasked block with fewer queries than keys (a ring step's earlier shard)."""
    args = _inputs(1, 9, 3, 2 * MIN_PIECE_ROWS, 3 * MIN_PIECE_ROWS, torch.float32, False)
    rec = Recorder()
    got = balanced_backward(rec, *args, is_causal=False, threads=2)
    assert rec.calls == [(6, MIN_PIECE_ROWS, False)]
    _assert_close(got, _plain(*args, False), 1e-6)


def test_sdpa_kernel_backward_uses_the_threads():
    """SdpaKernel's CPU backward balances for torch's intra-op threads, with the same gradients."""
    T = 2 * MIN_PIECE_ROWS
    dout, q, k, v, out, lse = _inputs(1, 9, 3, T, T, torch.float32, True)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        got = SdpaKernel()._bwd(dout, q, k, v, out, lse, SCALE, True, None)
    finally:
        torch.set_num_threads(before)
    _assert_close(got, _plain(dout, q, k, v, out, lse, True), 1e-6)
