"""Ulysses and hybrid CP with head counts the Ulysses degree does not split evenly (uneven head
shards, shared kv heads): output and dQ/dK/dV against single-process eager attention, and the
whole model's loss and gradients against cp = 1, with documents crossing the shards."""
import itertools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.attention import TOL, packed_ids
from helpers.cp import check_all, max_err, run_distributed
from longctx.attention import eager_attention
from longctx.model import ModelConfig, build_model
from longctx.parallel import make_cp_attention, positions_from_segments, shard_batch, shard_sequence
from longctx.parallel.checkpointing import apply_activation_checkpointing, model_key

# SmolLM2-135M's 9 query / 3 kv heads (head_dim 64); 6 / 2: a kv head shared by members 0 and 1 at
# U = 4; 12 / 6 at U = 4: U divides the query heads but neither divides nor is a multiple of the
# kv heads; 3 / 1 at U = 2: MQA, the one kv head replicated to uneven members
HEADS = {"9q3kv": (9, 3, 64), "6q2kv": (6, 2, 16), "12q6kv": (12, 6, 8), "3q1kv": (3, 1, 8)}


def _attention_worker(rank, world, impls, heads, L, boundaries):
    B = 2
    checks = []
    cps = {name: make_cp_attention(None, impl=impl, ulysses_size=u, backend="sdpa")
           for name, (impl, u) in impls.items()}
    for dtype, causal, name_h, docs in itertools.product(TOL, (True, False), heads, (False, True)):
        Hq, Hkv, D = HEADS[name_h]
        g = torch.Generator().manual_seed(99)
        q = torch.randn(B, Hq, L, D, generator=g).to(dtype)
        k = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
        v = torch.randn(B, Hkv, L, D, generator=g).to(dtype)
        dout = 0.25 * torch.randn(B, Hq, L, D, generator=g)
        seg = packed_ids(B, L, boundaries) if docs else None
        qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
        ref = eager_attention(qr, kr, vr, causal=causal, scale=D ** -0.5, segment_ids=seg)
        ref.backward(dout)
        want = {"out": ref, "dq": qr.grad, "dk": kr.grad, "dv": vr.grad}
        shard = lambda x: shard_sequence(x, rank, world, dim=2)  # noqa: E731
        for name, attn in cps.items():
            ql, kl, vl = (shard(x).detach().requires_grad_() for x in (q, k, v))
            seg_l = None if seg is None else shard_sequence(seg, rank, world, dim=1)
            out = attn(ql, kl, vl, causal=causal, segment_ids=seg_l)
            out.backward(shard(dout).to(dtype))
            case = f"{name}/{str(dtype)[6:]}/{'causal' if causal else 'full'}/{name_h}/{'docs' if docs else 'nodocs'}"
            assert out.dtype == dtype and kl.grad.shape == kl.shape and kl.grad.dtype == dtype
            for what, got in (("out", out), ("dq", ql.grad), ("dk", kl.grad), ("dv", vl.grad)):
                checks.append((case, what, max_err(got, shard(want[what])), TOL[dtype]))
    if "auto" in cps:  # the automatic hybrid degree for the first call's 9 / 3 heads at cp 4: 2 x ring 2
        lay = cps["auto"].layout
        checks.append(("auto", "layout 2x2", float((lay.ulysses_size, lay.ring_size) != (2, 2)), 0.0))
    return checks


def _n(impls, heads):
    return len(impls) * len(TOL) * 2 * len(heads) * 2 * 4


def test_uneven_ulysses_world2():
    impls = {"ulysses": ("ulysses", None)}
    heads = ("9q3kv", "3q1kv")
    # L=24 -> 4 chunks of 6; boundaries inside chunks (4, 15) and on shard boundaries (6, 18)
    check_all(run_distributed(_attention_worker, 2, impls, heads, 24, [4, 6, 15, 18]), _n(impls, heads))


def test_uneven_ulysses_and_hybrid_world4():
    impls = {"ulysses": ("ulysses", None), "hybrid2x2": ("hybrid", 2), "auto": ("hybrid", 0)}
    heads = ("9q3kv", "6q2kv", "12q6kv")
    # L=32 -> 8 chunks of 4; a document spanning chunks 2..5 (ranks 2, 3, 3, 2), cuts at 6 and 8
    check_all(run_distributed(_attention_worker, 4, impls, heads, 32, [6, 8, 21]), _n(impls, heads))


def _model_cfg():
    return ModelConfig(vocab_size=512, hidden_size=72, intermediate_size=160, num_hidden_layers=2,
                       num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=256, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=None, eos_token_id=None)


def _loss_sum(model, batch):
    logits = model(batch["input_ids"], position_ids=batch.get("position_ids"), segment_ids=batch.get("segment_ids"))
    return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=-100, reduction="sum")


def _model_worker(rank, world, impls, L):
    """Loss and every parameter gradient of a 9 q / 3 kv model at cp = world vs cp = 1, packed
    documents crossing the shards; `impls` name -> (impl, ulysses_size, full checkpointing)."""
    cfg, B = _model_cfg(), 2
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, cfg.vocab_size, (B, L), generator=g)
    seg = packed_ids(B, L, [5, 13, 20])
    labels = torch.cat([ids[:, 1:], torch.full((B, 1), -100)], dim=1)
    labels = labels.masked_fill(torch.cat([seg[:, 1:] != seg[:, :-1], torch.ones(B, 1, dtype=torch.bool)], 1), -100)
    batch = {"input_ids": ids, "labels": labels, "segment_ids": seg, "position_ids": positions_from_segments(seg)}
    n_tokens = int((labels != -100).sum())
    ref = build_model(cfg, seed=3)
    ref_loss = _loss_sum(ref, batch) / n_tokens
    ref_loss.backward()
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    local = shard_batch(batch, rank, world)
    checks = []
    for name, (impl, u, ckpt) in impls.items():
        model = build_model(cfg, seed=3)
        if ckpt:  # the recompute re-runs the uneven CP forward, communication included
            apply_activation_checkpointing(model, "full", recompute_attention=True)
        model.set_attention(make_cp_attention(None, impl=impl, ulysses_size=u))
        loss_sum = _loss_sum(model, local)
        (loss_sum / n_tokens).backward()
        total = loss_sum.detach().clone()
        dist.all_reduce(total)
        checks.append((name, "loss", abs(total.item() / n_tokens - ref_loss.item()) / abs(ref_loss.item()), 1e-5))
        for n, p in model.named_parameters():
            n = model_key(n)
            grad = p.grad.clone()
            dist.all_reduce(grad)
            rel = (grad - ref_grads[n]).abs().max().item() / max(ref_grads[n].abs().max().item(), 1e-30)
            checks.append((name, f"grad {n}", rel, 1e-5))
    return checks


def _n_model(impls):
    return len(impls) * (1 + len(list(build_model(_model_cfg(), seed=0).parameters())))


def test_uneven_model_cp2_matches_cp1():
    impls = {"ulysses": ("ulysses", None, False), "ulysses+ckpt-full": ("ulysses", None, True)}
    check_all(run_distributed(_model_worker, 2, impls, 24), _n_model(impls))


def test_uneven_model_cp4_matches_cp1():
    impls = {"ulysses": ("ulysses", None, False), "hybrid2x2": ("hybrid", 2, False)}
    check_all(run_distributed(_model_worker, 4, impls, 32), _n_model(impls))
