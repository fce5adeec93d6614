"""The model, attention backends, checkpointing and generation on an accelerator.

Skipped unless CUDA is available (CI has none). `LONGCTX_TEST_DEVICE=cpu` runs the same
checks on CPU, which is how they are kept honest between GPU runs. Every CUDA kernel that
imports here (SDPA, torch's varlen, flash-attn, FlashAttention-4, FlexAttention, and `auto`)
runs forward and backward against the fp32 CPU reference, with packed documents and as a
context-parallel block kernel (ring-style blocks merged by LSE, in one process); a kernel
that cannot run here is skipped with the reason. Tolerances: 1e-4 for fp32 (other summation
orders than the CPU), 2e-2 for bf16 (inputs rounded alike, O(1) gradients).
"""
import json
import os

import pytest
import torch

from helpers.attention import (
    CASES,
    DOC_CASES,
    assert_close,
    blocks_vs_whole,
    document_ids,
    make_qkv,
    packed_ids,
    reference,
)
from helpers.model import FAMILY_CASES, hf_twin, tiny_config, tiny_model
from longctx.attention import eager_attention, get_attention, get_kernel, kernel_attention, sdpa_attention
from longctx.attention.flex import flex_available, flex_document_attention
from longctx.attention.varlen import VarlenKernel, make_varlen_attention
from longctx.attention.varlen_ops import make_varlen_ops, varlen_problem
from longctx.commands import cli
from longctx.model import build_model, get_preset
from longctx.model.generate import generate
from longctx.model.hf import save_pretrained
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key

DEVICE = os.environ.get("LONGCTX_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="no CUDA device (set LONGCTX_TEST_DEVICE to force one)")

# fp32 on a GPU: different (but exact-math) kernels and summation orders than the CPU reference
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def _no_tf32():
    """TF32 matmuls would make every fp32 comparison a 1e-3 one."""
    if DEVICE != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _grads(fn, q, k, v, dout, **kw):
    qq, kk, vv = (x.detach().to(DEVICE).requires_grad_() for x in (q, k, v))
    res = fn(qq, kk, vv, **kw)
    out = res[0] if isinstance(res, tuple) else res
    out.backward(dout.to(DEVICE, out.dtype))
    return out, qq.grad, kk.grad, vv.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["sdpa", "eager", "block-kernel"])
@pytest.mark.parametrize("case", CASES, ids=[f"c{i}" for i in range(len(CASES))])
def test_attention_on_device_matches_cpu_reference(case, path, dtype):
    Hq, Hkv, T, S, causal, bounds = case
    q, k, v = make_qkv(B=2, Hq=Hq, Hkv=Hkv, T=T, S=S, dtype=dtype)
    seg = None if bounds is None else packed_ids(2, T, bounds)
    kw = dict(causal=causal, segment_ids=seg)
    want_out, _, dout, dq, dk, dv = reference(q, k, v, **kw)
    dev_kw = dict(kw, segment_ids=None if seg is None else seg.to(DEVICE))
    if path == "block-kernel":
        kernel = get_kernel("auto", DEVICE)

        def fn(a, b, c, **kk):
            return kernel_attention(kernel, a, b, c, **kk)
    else:
        fn = sdpa_attention if path == "sdpa" else eager_attention
    out, gq, gk, gv = _grads(fn, q, k, v, dout, **dev_kw)
    assert out.device.type == torch.device(DEVICE).type and out.dtype == dtype
    for name, got, want in (("out", out, want_out), ("dq", gq, dq), ("dk", gk, dk), ("dv", gv, dv)):
        assert_close(f"{path} {name}", got.cpu(), want, TOL[dtype])


def _varlen_ops(name):
    problem = varlen_problem(name, DEVICE)
    if problem is not None:
        pytest.skip(f"{name}: {problem}")
    return make_varlen_ops(name)


@pytest.mark.parametrize("name", ["varlen", "flash", "fa4"])
@pytest.mark.parametrize("case", DOC_CASES, ids=[f"c{i}" for i in range(len(DOC_CASES))])
def test_varlen_kernels_on_device_match_cpu_reference(case, name):
    """bf16 (the flash kernels' dtype): documents, GQA, bottom-right causal, decode."""
    fn = make_varlen_attention(_varlen_ops(name))
    Hq, Hkv, T, S, causal, bounds = case
    q, k, v = make_qkv(B=2, Hq=Hq, Hkv=Hkv, T=T, S=S, D=64, dtype=torch.bfloat16)
    seg, kv_seg = document_ids(2, T, S, bounds)
    kw = dict(causal=causal, segment_ids=seg, kv_segment_ids=kv_seg)
    want_out, _, dout, dq, dk, dv = reference(q, k, v, **kw)
    dev = {key: (x.to(DEVICE) if isinstance(x, torch.Tensor) else x) for key, x in kw.items()}
    out, gq, gk, gv = _grads(fn, q, k, v, dout, **dev)
    for what, got, want in (("out", out, want_out), ("dq", gq, dq), ("dk", gk, dk), ("dv", gv, dv)):
        assert_close(f"{name} {what}", got.cpu(), want, TOL[torch.bfloat16])


@pytest.mark.parametrize("name", ["varlen", "flash", "fa4"])
def test_varlen_kernels_on_device_as_context_parallel_blocks(name):
    """The block kernel every CP impl uses: per-block cu_seqlens, LSE merged in fp32, each
    block's backward from the final out/lse."""
    errors = blocks_vs_whole(VarlenKernel(_varlen_ops(name)), torch.bfloat16, DEVICE)
    assert all(err <= TOL[torch.bfloat16] for err in errors.values()), errors


def test_flex_on_device_matches_cpu_reference():
    problem = flex_available(DEVICE)
    if problem is not None:
        pytest.skip(f"flex: {problem}")
    q, k, v = make_qkv(B=2, Hq=8, Hkv=2, T=512, S=512, D=64, dtype=torch.bfloat16)
    seg = packed_ids(2, 512, [5, 130, 300, 301])
    want_out, _, dout, dq, dk, dv = reference(q, k, v, causal=True, segment_ids=seg)

    def fn(a, b, c, segment_ids):
        return flex_document_attention(a, b, c, segment_ids)

    out, gq, gk, gv = _grads(fn, q, k, v, dout, segment_ids=seg.to(DEVICE))
    for what, got, want in (("out", out, want_out), ("dq", gq, dq), ("dk", gk, dk), ("dv", gv, dv)):
        assert_close(f"flex {what}", got.cpu(), want, TOL[torch.bfloat16] * max(1.0, want.abs().max()))


@pytest.mark.parametrize("docs", [None, [100, 300, 301, 700]], ids=["whole-rows", "documents"])
@pytest.mark.parametrize("heads", [(9, 3, 64), (8, 2, 128)], ids=["smollm2", "llama3"])
def test_auto_attention_on_device_matches_cpu_reference(docs, heads):
    """`auto` with the kernel its rule picks for these shapes (named in the failure message)."""
    Hq, Hkv, D = heads
    attn = get_attention("auto", DEVICE)
    q, k, v = make_qkv(B=2, Hq=Hq, Hkv=Hkv, T=1024, S=1024, D=D, dtype=torch.bfloat16)
    seg = None if docs is None else packed_ids(2, 1024, docs)
    want_out, _, dout, dq, dk, dv = reference(q, k, v, causal=True, segment_ids=seg)
    seg_dev = None if seg is None else seg.to(DEVICE)
    out, gq, gk, gv = _grads(attn, q, k, v, dout, causal=True, segment_ids=seg_dev)
    method = attn.method(q.to(DEVICE), k.to(DEVICE), True, seg_dev, None) if hasattr(attn, "method") else "sdpa"
    for what, got, want in (("out", out, want_out), ("dq", gq, dq), ("dk", gk, dk), ("dv", gv, dv)):
        # dk/dv sum over up to 1024 queries x the group: bf16 rounding grows with their magnitude
        assert_close(f"auto ({method}) {what}", got.cpu(), want, TOL[torch.bfloat16] * max(1.0, want.abs().max()))


@pytest.mark.parametrize("family, rope", [(f, r) for f in ("llama", "qwen2", "qwen3")
                                          for r in ("default", "yarn", "llama3", "longrope", "dynamic")
                                          if not (f == "qwen3" and r == "longrope")])  # its factors are per head_dim
def test_model_on_device_matches_transformers(family, rope):
    """fp32: ours and transformers' class of the family agree on the device; bf16: ours is no
    further from the fp32 logits than transformers' own bf16 run is."""
    cfg_T = 4 * 32  # 4x the tiny configs' original length (32)
    ids = torch.randint(0, 128, (2, cfg_T), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    family_fields = FAMILY_CASES[family]
    ours = tiny_model(rope, "gqa", **family_fields).to(DEVICE)
    hf = hf_twin(tiny_model(rope, "gqa", **family_fields)).to(DEVICE)
    with torch.no_grad():
        a, b = ours(ids), hf(input_ids=ids).logits
        assert (a - b).abs().max().item() <= 1e-4
        ours16 = tiny_model(rope, "gqa", **family_fields).to(DEVICE, torch.bfloat16)
        hf16 = hf_twin(tiny_model(rope, "gqa", **family_fields)).to(DEVICE, torch.bfloat16)
        err_ours = (ours16(ids).float() - a).abs().max().item()
        err_hf = (hf16(input_ids=ids).logits.float() - a).abs().max().item()
    assert err_ours <= 1.5 * err_hf + 1e-2, (err_ours, err_hf)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_greedy_generation_on_device_matches_transformers(family):
    ours = tiny_model("yarn", "gqa", seed=5, **FAMILY_CASES[family]).to(DEVICE)
    hf = hf_twin(tiny_model("yarn", "gqa", seed=5, **FAMILY_CASES[family])).to(DEVICE)
    prompts = [torch.randint(0, 128, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (20, 13)]
    got = generate(ours, prompts, max_new_tokens=24)
    for prompt, tokens in zip(prompts, got):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=24, do_sample=False,
                              pad_token_id=0)[0, len(prompt):].tolist()
        assert tokens == ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_checkpointed_chunked_loss_gradients_on_device(dtype):
    """Activation checkpointing + chunked loss + packed documents give the plain model's
    gradients on the device (bf16: both runs round the same way, so the bound is loose only
    for recomputation order)."""
    torch.manual_seed(0)
    cfg = tiny_config("yarn", "gqa")
    ids = torch.randint(0, 128, (2, 96), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    labels = torch.cat([ids[:, 1:], torch.full((2, 1), -100, device=DEVICE)], 1)
    seg = packed_ids(2, 96, [30, 61]).to(DEVICE)
    grads = []
    for policy in ("none", "full"):
        model = build_model(cfg, seed=3, device=DEVICE, dtype=dtype)
        apply_activation_checkpointing(model, policy)
        loss_sum, n = model(ids, segment_ids=seg, labels=labels, loss_chunk_size=40)
        (loss_sum / n).backward()
        grads.append({model_key(name): p.grad.float().cpu()
                      for name, p in model.named_parameters()})
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for name in grads[0]:
        assert_close(name, grads[1][name], grads[0][name], tol)


def test_training_steps_on_device_reduce_loss():
    """bf16 parameters, AdamW, checkpointing, packed documents: 30 steps on one batch learn it."""
    model = build_model(tiny_config("default", "gqa"), seed=0, device=DEVICE, dtype=torch.bfloat16)
    apply_activation_checkpointing(model, "full")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    labels = torch.cat([ids[:, 1:], torch.full((4, 1), -100, device=DEVICE)], 1)
    seg = packed_ids(4, 64, [20, 41]).to(DEVICE)
    losses = []
    for _ in range(30):
        loss_sum, n = model(ids, segment_ids=seg, labels=labels)
        loss = loss_sum / n
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)], ids=["fp32", "bf16"])
def test_chunked_loss_on_device_matches_plain_fp32(dtype, tol):
    """The vocabulary head's chunked loss (bf16 on CUDA: tensor-core GEMM with fp32 output for
    the head's gradient) against plain fp32 cross-entropy on CPU."""
    import torch.nn.functional as F

    from longctx.model.loss import chunked_cross_entropy

    g = torch.Generator().manual_seed(0)
    N, d, V = 700, 64, 3000
    h = torch.randn(N, d, generator=g).to(dtype)
    W = (0.1 * torch.randn(V, d, generator=g)).to(dtype)
    y = torch.randint(0, V, (N,), generator=g)
    y[::7] = -100
    hd, Wd = (x.detach().clone().to(DEVICE).requires_grad_() for x in (h, W))
    loss_sum, wsum = chunked_cross_entropy(hd, Wd, y.to(DEVICE), None, chunk_size=128)
    (loss_sum / wsum).backward()
    hr, Wr = (x.detach().float().requires_grad_() for x in (h, W))
    ref = F.cross_entropy(hr @ Wr.t(), y, ignore_index=-100)
    ref.backward()
    assert abs((loss_sum / wsum).item() - ref.item()) <= tol * max(1.0, ref.item())
    for name, got, want in (("grad_hidden", hd.grad, hr.grad), ("grad_weight", Wd.grad, Wr.grad)):
        assert got.dtype == dtype
        assert_close(name, got.cpu(), want, tol * max(1.0, want.abs().max().item()))


def test_longctx_eval_runs_on_the_device(tmp_path):
    """`longctx eval --device auto` evaluates on this rank's GPU (the CPU without one): every
    cell records where it ran."""
    model_dir, out = tmp_path / "model", tmp_path / "eval"
    save_pretrained(build_model(get_preset("debug-tiny", max_position_embeddings=1024), seed=1), model_dir)
    assert cli.main(["eval", "--model", str(model_dir), "--tokenizer", "byte", "--suite", "ppl", "--tasks", "passkey",
                     "--lengths", "512", "--samples", "2", "--style", "compact", "--max-new-tokens", "8",
                     "--ppl-windows", "1", "--out", str(out), "--no-progress",
                     "--device", "auto" if DEVICE == "cuda" else DEVICE]) == 0
    cells = [json.loads(p.read_text()) for p in (out / "cells").rglob("*.json")]
    assert len(cells) == 2 and all(c["computed_with"][-1]["device"] == torch.device(DEVICE).type for c in cells)
