"""CPU kernels of a training step against their plain versions, measured in the same run:

* attention over packed rows (forward + backward, bf16): document-run tiles (the sdpa kernel's
  default on CPU: per row, each document against itself, unmasked) vs the masked tiles it
  used before (one call with a document mask) vs torch's `scaled_dot_product_attention` with
  the boolean mask (what a plain implementation runs);
* the CPU flash kernel's backward at SmolLM2's heads (9 query / 3 kv, fp32, one causal row of
  4096 tokens): one call vs thread-balanced pieces (the sdpa kernel's default; run with
  `--threads 2` or more: on one thread both are one call);
* RoPE (forward + backward, bf16 q in the model's strided layout): the autograd function vs
  the textbook `x * cos + rotate_half(x) * sin` in fp32;
* RMSNorm (forward + backward, fp32, SmolLM2's 8192 x 576 tokens): the autograd function (keeps
  the input and 1/rms only) vs the textbook `weight * x * rsqrt(mean(x^2) + eps)` under autograd;
* AdamW step on the demo model's fp32 parameters: fused vs the per-tensor loop;
* the demo model's forward + backward (bf16, 8 x 256 tokens, one document per row) with its
  norms and MLPs compiled (`parallel.compile=norms_mlp`) vs eager; the compile time is printed.

    .venv/bin/python benchmarks/bench_kernels.py [--threads 1] [--iters 10]

Each table: `--warmup` untimed calls per variant (default 1), then `iters` (or a multiple of it)
timed rounds with the variants interleaved (benchlib.timing) so machine drift hits them alike; median and min
per variant. Ratios are of medians, against the plain version in the same run. `--json PATH`
writes every table with its timing fields.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from benchlib.report import timing_fields, write_json
from benchlib.timing import DEFAULT_WARMUP, interleaved

from longctx.attention import kernel_attention
from longctx.attention.balanced import balanced_backward
from longctx.attention.core import build_mask
from longctx.attention.sdpa import SdpaKernel
from longctx.model import ModelConfig, build_model
from longctx.model.norm import RMSNorm
from longctx.model.rope import RotaryEmbedding, apply_rotary, rotate_reference


def packed_ids(B: int, T: int, docs: int, gen: torch.Generator) -> torch.Tensor:
    """(B, T) ids of `docs` documents per row at random boundaries (distinct ids per row)."""
    ids = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        cuts = torch.randperm(T - 1, generator=gen)[:docs - 1] + 1
        ids[b] = torch.bucketize(torch.arange(T), cuts.sort().values, right=True) + b * docs
    return ids


def attention_fns(B, H, T, D, docs, gen):
    q, k, v = (torch.randn(B, H, T, D, generator=gen).to(torch.bfloat16).requires_grad_() for _ in range(3))
    dout = torch.randn(B, H, T, D, generator=gen).to(torch.bfloat16)
    ids = packed_ids(B, T, docs, gen)
    runs, masked = SdpaKernel(), SdpaKernel()
    masked.document_runs = False

    def kernel(kern):
        def fn():
            out, _ = kernel_attention(kern, q, k, v, causal=True, segment_ids=ids)
            out.backward(dout)
        return fn

    mask = build_mask(T, T, causal=True, segment_ids=ids, kv_segment_ids=None, device="cpu")

    def plain():
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(dout)

    return {"sdpa + bool mask": plain, "masked tiles": kernel(masked), "document runs": kernel(runs)}


def flash_backward_fns(T, gen):
    q = torch.randn(1, 9, T, 64, generator=gen)  # (1, Hq, T, D)
    k, v = (torch.randn(1, 3, T, 64, generator=gen) for _ in range(2))  # (1, Hkv, T, D)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    dout = torch.randn(out.shape, generator=gen)

    def call(dout, q, k, v, out, lse, is_causal):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout, q, k, v, out, lse, 0.0, is_causal)

    def balanced():
        balanced_backward(call, dout, q, k, v, out, lse, is_causal=True, threads=torch.get_num_threads())

    return {"one call": lambda: call(dout, q, k, v, out, lse, True), "thread-balanced": balanced}


def rope_fns(B, H, T, D, gen):
    cos, sin = RotaryEmbedding({"rope_type": "default", "rope_theta": 10000.0}, D, T)(torch.arange(T).expand(B, T))
    x = torch.randn(B, T, H * D, generator=gen).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(B, H, T, D, generator=gen).to(torch.bfloat16)

    def run(fn):
        return lambda: fn(x.view(B, T, H, D).transpose(1, 2), cos, sin).backward(grad)

    return {"textbook": run(rotate_reference), "autograd function": run(apply_rotary)}


def rmsnorm_fns(N, d, gen):
    x = torch.randn(1, N, d, generator=gen).requires_grad_()
    grad = torch.randn(1, N, d, generator=gen)
    norm = RMSNorm(d, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.1 * torch.randn(d, generator=gen))

    def textbook():
        variance = x.pow(2).mean(-1, keepdim=True)
        (norm.weight * (x * torch.rsqrt(variance + norm.eps))).backward(grad)

    return {"textbook": textbook, "autograd function": lambda: norm(x).backward(grad)}


def adam_fns():
    cfg = _demo_config()
    fns = {}
    for name, kw in (("per-tensor loop", {"foreach": False}), ("fused", {"fused": True})):
        params = list(build_model(cfg, dtype=torch.float32).parameters())
        for p in params:
            p.grad = torch.randn_like(p)
        fns[name] = torch.optim.AdamW(params, lr=1e-3, **kw).step
    return fns


def compiled_step_fns(gen):
    from longctx.parallel.compiled import compile_pointwise

    cfg = _demo_config()
    ids = torch.randint(0, 256, (8, 256), generator=gen)
    labels = torch.randint(0, 256, (8, 256), generator=gen)
    labels[:, 250:] = -100
    seg = torch.zeros(8, 256, dtype=torch.long)
    seg[:, 250:] = -1  # padding after a 250-token document
    fns = {}
    for name, mode in (("eager", "none"), ("compiled norms/MLP", "norms_mlp")):
        model = build_model(cfg, dtype=torch.bfloat16)
        compile_pointwise(model, mode)

        def step(model=model):
            loss_sum, n = model(ids, segment_ids=seg, labels=labels)
            (loss_sum / n).backward()

        start = time.perf_counter()
        step()
        if mode != "none":
            print(f"  (first compiled step, compile included: {time.perf_counter() - start:.1f} s)")
        fns[name] = step
    return fns


def _demo_config() -> ModelConfig:
    return ModelConfig(vocab_size=260, hidden_size=256, intermediate_size=688, num_hidden_layers=3,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=256,
                       rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def report(title: str, timings: dict, tables: list) -> None:
    base = next(iter(timings.values())).median_s
    print(f"\n{title}")
    for name, t in timings.items():
        print(f"  {name:<20} {t.median_s * 1e3:8.2f} ms (min {t.min_s * 1e3:8.2f})   {base / t.median_s:5.2f}x")
    tables.append({"title": title, "rows": [{"variant": name, **timing_fields(t)} for name, t in timings.items()]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--iters", type=int, default=10, help="timed rounds of the attention tables (others: a multiple)")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed calls per variant first")
    ap.add_argument("--json", help="also write every table here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    tables: list = []
    print(f"torch {torch.__version__}, {args.threads} thread(s), median (and min) of {args.iters} interleaved rounds")

    def timed(fns: dict, steps: int) -> dict:
        return interleaved(fns, steps=steps, warmup=args.warmup)

    for B, T, docs in ((4, 1024, 1), (4, 1024, 2), (4, 1024, 4), (8, 256, 1)):
        report(f"attention fwd+bwd, bf16, (B={B}, H=4, T={T}, D=64), {docs} document(s) per row",
               timed(attention_fns(B, 4, T, 64, docs, gen), args.iters), tables)
    report(f"flash attention backward, fp32, causal (1, 9 q / 3 kv heads, 4096, 64), {args.threads} thread(s)",
           timed(flash_backward_fns(4096, gen), args.iters), tables)
    report("RoPE fwd+bwd, bf16 q (8, 4, 256, 64)", timed(rope_fns(8, 4, 256, 64, gen), args.iters * 5), tables)
    report("RMSNorm fwd+bwd, fp32 (8192, 576)", timed(rmsnorm_fns(8192, 576, gen), args.iters * 2), tables)
    report("AdamW step, 2.5M fp32 parameters in 30 tensors", timed(adam_fns(), args.iters * 5), tables)
    report("demo model fwd+bwd, bf16, 8 x 256 tokens", timed(compiled_step_fns(gen), args.iters * 2), tables)
    if args.json:
        write_json(args.json, {"threads": args.threads, "tables": tables})


if __name__ == "__main__":
    main()
