"""Document-masked attention (packed rows, causal within each document), forward + backward: every
kernel that runs on this machine, against an fp32 reference, with the method longctx's `auto`
backend picks for the row and how far it is from the fastest kernel measured there.

Kernels (a row names why one cannot run: no CUDA device, a package that does not import, an error):
  dense mask            F.scaled_dot_product_attention with a (B, 1, T, T) keep-mask (skipped
                        above --dense-max-len: the mask alone is B*T*T bytes)
  document runs         the sdpa backend's path: a causal call per long document, a masked call
                        per group of short neighbours (longctx.attention.sdpa.document_runs_attention)
  per document          one causal SDPA call per document
  torch varlen          torch's flash kernel with cu_seqlens (make_varlen_ops("varlen"))
  flash-attn 2          flash-attn's varlen kernel (make_varlen_ops("flash"))
  FA4                   FlashAttention-4's varlen kernel (make_varlen_ops("fa4"))
  flex                  FlexAttention with a document block mask (flex_document_attention)
  auto                  get_attention("auto", device): what training calls; the row names its choice
  causal floor          causal SDPA over the whole row, no documents (exact only for one document)

The reference is one fp32 causal SDPA call per document (O(T) memory on CUDA). Each kernel's
maximum absolute error against it (output, then the largest over dq, dk, dv) comes before its
time. Times: --warmup untimed calls, then the median of --repeats (CUDA events on CUDA).
"auto / fastest" is auto's time over the fastest other exact kernel of the row.

    python benchmarks/bench_doc_attention.py --device cuda --cases 32768:1/16/64,131072:16 \\
        --shapes 9/3x64,32/8x128 --out doc_attention.json

Without --cases, every --lengths x --docs pair; without --shapes, --heads and --head-dim. --out
is rewritten after every row, so a run stopped by a timeout keeps the rows it finished.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from benchlib.machine import machine_facts

from longctx.attention.core import build_mask
from longctx.attention.flex import flex_available, flex_document_attention
from longctx.attention.sdpa import document_runs_attention
from longctx.attention.select import get_attention
from longctx.attention.varlen import make_varlen_attention
from longctx.attention.varlen_ops import make_varlen_ops, varlen_problem
from longctx.storage import atomic

FLOOR = "causal floor"
AUTO = "auto"
VARLEN = {"torch varlen": "varlen", "flash-attn 2": "flash", "FA4": "fa4"}
METHODS = ("dense mask", "document runs", "per document", *VARLEN, "flex", AUTO, FLOOR)


def document_ids(B: int, T: int, docs: int, seed: int) -> torch.Tensor:
    """(B, T) ids of `docs` contiguous documents per row, cut at seeded random positions."""
    rng = random.Random(seed)
    rows = []
    for _ in range(B):
        cuts = sorted(rng.sample(range(1, T), docs - 1))
        ids = torch.zeros(T, dtype=torch.long)
        for c in cuts:
            ids[c:] += 1
        rows.append(ids)
    return torch.stack(rows)


def auto_method(attn, q, k, ids) -> str:
    """The method `auto` takes for this call (off CUDA `auto` is the sdpa backend)."""
    method = getattr(attn, "method", None)
    return method(q, k, True, ids, None) if method else "sdpa"


def contenders(ids: torch.Tensor, device: torch.device, dense_max_len: int) -> dict:
    """name -> attention(q, k, v) -> out, causal over the packed documents of `ids` (the floor: none),
    or the reason (str) the kernel cannot run here."""
    T = ids.shape[1]
    gqa = lambda q, k: q.shape[1] != k.shape[1]  # noqa: E731

    def dense(q, k, v):
        mask = build_mask(T, T, causal=True, segment_ids=ids, kv_segment_ids=None, device=q.device)  # (B,1,T,T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa(q, k))

    found = {
        "dense mask": dense if T <= dense_max_len else f"skipped: T > --dense-max-len {dense_max_len}",
        "document runs": lambda q, k, v: document_runs_attention(q, k, v, ids),
        "per document": lambda q, k, v: document_runs_attention(q, k, v, ids, group_tokens=1),
    }
    for label, name in VARLEN.items():
        problem = varlen_problem(name, device)
        if problem is None:
            try:
                attn = make_varlen_attention(make_varlen_ops(name))
                problem = lambda q, k, v, attn=attn: attn(q, k, v, causal=True, segment_ids=ids)  # noqa: E731
            except Exception as e:  # an import that works but a kernel module that does not load
                problem = f"unavailable: {one_line(e)}"
        else:
            problem = f"unavailable: {problem}"
        found[label] = problem
    flex_problem = flex_available(device)
    found["flex"] = (lambda q, k, v: flex_document_attention(q, k, v, ids)) if flex_problem is None \
        else f"unavailable: {flex_problem}"
    auto = get_attention("auto", device)
    found[AUTO] = lambda q, k, v: auto(q, k, v, causal=True, segment_ids=ids)
    found[FLOOR] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa(q, k))
    return found


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:200]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(fn, q, k, v, dout) -> tuple:
    qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
    out = fn(qq, kk, vv)
    out.backward(dout)
    return out.detach(), qq.grad, kk.grad, vv.grad


def timed(fn, q, k, v, dout, warmup: int, repeats: int) -> tuple[float, float | None, tuple]:
    """Median seconds of forward + backward over `repeats` calls after `warmup` untimed ones, peak
    GiB (CUDA: max allocated during the timed calls), and (out, dq, dk, dv) of the last call."""
    device = q.device
    cuda = device.type == "cuda"
    for _ in range(warmup):
        run_once(fn, q, k, v, dout)
    sync(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = run_once(fn, q, k, v, dout)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            result = run_once(fn, q, k, v, dout)
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None
    return statistics.median(times), peak, result


def reference(q, k, v, dout, ids) -> tuple:
    """fp32 (out, dq, dk, dv): one causal SDPA call per document."""
    f = lambda x: x.float()  # noqa: E731
    return run_once(lambda a, b, c: document_runs_attention(a, b, c, ids, group_tokens=1), f(q), f(k), f(v), f(dout))


def errors(result: tuple, ref: tuple) -> tuple[float, float]:
    """Max abs error of the output, and the largest over the three gradients."""
    diff = [(a.float() - b).abs().max().item() for a, b in zip(result, ref)]
    return diff[0], max(diff[1:])


def parse_ints(name: str, text: str, minimum: int = 1, sep: str = ",") -> list[int]:
    try:
        values = [int(x) for x in text.split(sep)]
    except ValueError:
        values = []
    if not values or any(x < minimum for x in values):
        raise ValueError(f"--{name}: {text!r}; use comma-separated integers >= {minimum}")
    return values


def parse_cases(text: str) -> list[tuple[int, list[int]]]:
    """'32768:1/16/64,131072:16' -> [(32768, [1, 16, 64]), (131072, [16])]."""
    cases = []
    for item in text.split(","):
        T, _, docs = item.partition(":")
        try:
            cases.append((parse_ints("cases", T, 2)[0], parse_ints("cases", docs, 1, "/")))
        except ValueError:
            raise ValueError(f"--cases: {text!r}; use TOKENS:DOCS/DOCS,... e.g. 32768:1/16/64,131072:16") from None
    return cases


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'9/3x64,32/8x128' -> [(9, 3, 64), (32, 8, 128)] (query heads, kv heads, head dim)."""
    shapes = []
    for item in text.split(","):
        heads, _, dim = item.partition("x")
        hq, _, hkv = heads.partition("/")
        try:
            shape = (int(hq), int(hkv), int(dim))
        except ValueError:
            shape = (0, 0, 0)
        if min(shape) < 1 or shape[0] % shape[1]:
            raise ValueError(f"--shapes: {text!r}; use QUERY/KVxDIM,... with KV dividing QUERY, e.g. 9/3x64,32/8x128")
        shapes.append(shape)
    return shapes


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--lengths", default="32768", help="comma-separated tokens per row")
    p.add_argument("--docs", default="1,4,16,64", help="comma-separated documents per row")
    p.add_argument("--cases", help="TOKENS:DOCS/DOCS,... (instead of --lengths x --docs)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", default="9,3", help="query heads,kv heads")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--shapes", help="QUERY/KVxDIM,... e.g. 9/3x64,32/8x128 (instead of --heads, --head-dim)")
    p.add_argument("--warmup", type=int, default=2, help="untimed calls per kernel first")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--dense-max-len", type=int, default=32768, help="skip the dense mask above this length")
    p.add_argument("--out", type=Path, help="write the rows and the machine facts as JSON")
    args = p.parse_args(argv)
    try:
        if args.cases:
            cases = parse_cases(args.cases)
        else:
            lengths, docs = parse_ints("lengths", args.lengths, 2), parse_ints("docs", args.docs)
            cases = [(T, docs) for T in lengths]
        if args.shapes:
            shapes = parse_shapes(args.shapes)
        else:
            heads = parse_ints("heads", args.heads)
            if len(heads) != 2 or heads[0] % heads[1]:
                raise ValueError(f"--heads: {args.heads!r}; use QUERY,KV with KV dividing QUERY, e.g. 9,3")
            shapes = [(heads[0], heads[1], args.head_dim)]
        if args.batch < 1 or args.head_dim < 1 or args.repeats < 1:
            raise ValueError("--batch, --head-dim, --repeats: must be >= 1")
        if args.warmup < 0:
            raise ValueError("--warmup: must be >= 0")
        for T, docs in cases:
            if max(docs) > T:
                raise ValueError(f"--docs: {max(docs)} documents do not fit in {T} tokens")
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device: cuda, but this process sees no CUDA device; valid here: cpu")
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = {"command": " ".join(sys.argv), "dtype": args.dtype, "device": str(device), "warmup": args.warmup,
              "repeats": args.repeats, "reference": "fp32, one causal SDPA call per document", "rows": []}

    def save(row: dict) -> None:
        report["rows"].append(row)
        if args.out:
            atomic.write_text(args.out, json.dumps({**report, "machine": machine_facts()}, indent=1))

    rows = measure(cases, shapes, args.batch, getattr(torch, args.dtype), device, args.warmup, args.repeats,
                   args.dense_max_len, save)
    print_table(rows)
    return 0


def measure(cases, shapes, B, dtype, device, warmup, repeats, dense_max_len, save=None) -> list[dict]:
    """One row per (shape, tokens, docs); each kernel's line is printed as it finishes."""
    rows = []
    for Hq, Hkv, D in shapes:
        for T, docs in cases:
            g = torch.Generator().manual_seed(T)
            q, k, v, dout = (torch.randn(B, h, T, D, generator=g).to(device, dtype) for h in (Hq, Hkv, Hkv, Hq))
            for n in docs:
                row = measure_row(q, k, v, dout, document_ids(B, T, n, seed=n).to(device), dense_max_len,
                                  warmup, repeats)
                row.update(tokens=T, docs=n, batch=B, heads=[Hq, Hkv], head_dim=D)
                rows.append(row)
                if save:
                    save(row)
            del q, k, v, dout
    return rows


def measure_row(q, k, v, dout, ids, dense_max_len, warmup, repeats) -> dict:
    device, T, n = q.device, q.shape[2], int(ids[0].max()) + 1
    ref = reference(q, k, v, dout, ids)
    methods = {}
    for name, fn in contenders(ids, device, dense_max_len).items():
        if isinstance(fn, str):
            methods[name] = {"error": fn}
        else:
            try:
                s, peak, result = timed(fn, q, k, v, dout, warmup, repeats)
                err_out, err_grad = errors(result, ref)
                methods[name] = {"ms": s * 1e3, "peak_gib": peak, "err_out": err_out, "err_grad": err_grad,
                                 "exact": name != FLOOR or n == 1}  # the floor ignores documents
                del result
            except Exception as e:  # a kernel that fails (OOM, a compile error) is a row entry
                methods[name] = {"error": one_line(e)}
            if device.type == "cuda":
                torch.cuda.empty_cache()
        m = methods[name]
        text = f"{m['ms']:.2f} ms (err out {m['err_out']:.1e}, grads {m['err_grad']:.1e})" if "ms" in m else m["error"]
        print(f"  T={T} docs={n} heads={q.shape[1]}/{k.shape[1]}x{q.shape[3]} {name}: {text}", flush=True)
    attn = get_attention("auto", device)
    row = {"methods": methods, "auto_method": auto_method(attn, q, k, ids)}
    exact = {name: m["ms"] for name, m in methods.items() if m.get("exact") and name != AUTO}
    if exact and "ms" in methods[AUTO]:
        row["fastest"] = min(exact, key=exact.get)
        row["auto_over_fastest"] = methods[AUTO]["ms"] / exact[row["fastest"]]
    return row


def cell(m: dict) -> str:
    if "ms" in m:
        return f"{m['ms']:.2f}"
    return "—" if m["error"].startswith(("skipped", "unavailable")) else "failed"


def print_table(rows: list[dict]) -> None:
    """The markdown table (ms; errors and failures above it, in the per-kernel lines and JSON)."""
    print("\n| heads × dim | tokens | docs | " + " | ".join(f"{m} ms" for m in METHODS)
          + " | auto chose | auto / fastest | fastest |")
    print("|---|---:|---:|" + "---:|" * len(METHODS) + "---|---:|---|")
    for r in rows:
        ratio = f"{r['auto_over_fastest']:.2f}" if "auto_over_fastest" in r else "—"
        print(f"| {r['heads'][0]}/{r['heads'][1]}×{r['head_dim']} | {r['tokens']} | {r['docs']} | "
              + " | ".join(cell(r["methods"][m]) for m in METHODS)
              + f" | {r['auto_method']} | {ratio} | {r.get('fastest', '—')} |")
    worst = max((max(m["err_out"], m["err_grad"]) for r in rows for m in r["methods"].values() if m.get("exact")),
                default=0.0)
    print(f"\nms: median forward + backward; largest error of any kernel vs the fp32 reference: {worst:.1e}; "
          "— = unavailable or skipped, failed = an error (both named in the JSON and the lines above)")


if __name__ == "__main__":
    sys.exit(main())
