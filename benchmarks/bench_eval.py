"""Eval runner benchmark (CPU): throughput vs transformers, and peak memory with cp=2.

    .venv/bin/python benchmarks/bench_eval.py            # both parts, prints a markdown table
    .venv/bin/python benchmarks/bench_eval.py --quick    # smaller, for a smoke run

1. prefill+decode tokens/s of our runner (longctx Engine: batched greedy with the KV cache)
   vs transformers' LlamaForCausalLM.generate on the same weights and the same left-padded
   prompts (RULER niah prompts fitted with the byte tokenizer); both interleaved (benchlib.timing:
   `--warmup` untimed runs, then `--repeats` timed rounds), tokens/s at the median and the min
   time, ratio in the same run.
2. peak memory of one prompt 8x longer than part 1's, decoded in one process vs split across
   cp=2 gloo ranks (torchrun): growth of the peak RSS over the RSS after loading the model
   (one run each: a memory measurement; its seconds are that one run's).
`--json PATH` writes both parts with the timing fields (steps, warmup, median_s, min_s).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
from benchlib.memory import peak_rss_bytes, rss_bytes
from benchlib.procs import free_port
from benchlib.report import markdown_table, timing_fields, write_json
from benchlib.timing import DEFAULT_STEPS, DEFAULT_WARMUP, interleaved


def bench_model_dir(path: str, seq: int) -> None:
    import longctx
    from longctx.model import ModelConfig, build_model

    cfg = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=seq,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      bos_token_id=None, eos_token_id=None, initializer_range=0.2)
    longctx.save_pretrained(build_model(cfg, seed=0), path)


class NoEos:
    """The byte tokenizer without EOS, so both generators produce exactly max_new_tokens."""

    def __init__(self):
        from longctx.data.tokenizer import load_tokenizer

        self.t = load_tokenizer("byte")
        self.bos_id, self.eos_id, self.pad_id, self.vocab_size = self.t.bos_id, None, self.t.pad_id, self.t.vocab_size

    def encode(self, text, add_bos=False, add_eos=False):
        return self.t.encode(text, add_bos=add_bos)

    def decode(self, ids):
        return self.t.decode(ids)


def throughput(model_dir: str, length: int, batch: int, new_tokens: int, repeats: int = DEFAULT_STEPS,
               warmup: int = DEFAULT_WARMUP) -> dict:
    from transformers import LlamaForCausalLM

    import longctx
    from longctx.eval.runner import Engine
    from longctx.eval.tasks import TaskOptions, build_samples

    tok = NoEos()
    samples = build_samples("niah_single_2", tok, length, batch, options=TaskOptions(max_new_tokens=new_tokens))
    ours = longctx.load_pretrained(model_dir).eval()
    engine = Engine(ours, tok, batch_size=batch)
    prompts = [engine.encode(s.prompt) for s in samples]
    hf = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    L = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_id] * (L - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    total_tokens = sum(map(len, prompts)) + batch * new_tokens

    def run_ours():
        return engine.generate_ids(prompts, new_tokens)

    def run_hf():
        with torch.no_grad():
            return hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=tok.pad_id)

    out = {}

    def ours_step():
        out["ours"] = run_ours()

    def hf_step():
        out["hf"] = run_hf()

    t = interleaved({"ours": ours_step, "hf": hf_step}, steps=repeats, warmup=warmup)
    same = [o for o in out["ours"]] == [r[L:].tolist() for r in out["hf"]]
    return {"prompt_len": L, "batch": batch, "new_tokens": new_tokens, "tokens": total_tokens,
            "ours_tok_s": total_tokens / t["ours"].median_s, "hf_tok_s": total_tokens / t["hf"].median_s,
            "ours_tok_s_fastest": total_tokens / t["ours"].min_s, "hf_tok_s_fastest": total_tokens / t["hf"].min_s,
            "ratio": t["hf"].median_s / t["ours"].median_s, "same_tokens": same,
            "ours": timing_fields(t["ours"]), "hf": timing_fields(t["hf"])}


def memory_worker(model_dir: str, length: int, new_tokens: int, out: str) -> None:
    """Run inside one process or each torchrun rank: prefill+decode one long prompt."""
    import longctx
    from longctx.eval.runner import Engine

    world = int(os.environ.get("WORLD_SIZE", "1"))
    group = None
    if world > 1:
        from longctx.parallel.mesh import build_mesh, init_distributed

        init_distributed()
        group = build_mesh(world).cp_group
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    model = longctx.load_pretrained(model_dir).eval()
    tok = NoEos()
    engine = Engine(model, tok, cp_group=group, batch_size=1)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 256, (length,), generator=g).tolist()
    engine.generate_ids([prompt[:64]], 2)  # warm-up allocations outside the measurement
    base = rss_bytes()
    t = time.perf_counter()
    engine.generate_ids([prompt], new_tokens)
    secs = time.perf_counter() - t
    peak = peak_rss_bytes()
    rank = int(os.environ.get("RANK", "0"))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"rank": rank, "peak_growth": peak - base, "seconds": secs}, f)


def memory(model_dir: str, length: int, new_tokens: int) -> dict:
    res = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, PYTHONWARNINGS="ignore")
        for name, launcher in [("one process", [sys.executable]),
                               ("cp=2", [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                                         "--master-port", str(free_port())])]:
            out = os.path.join(tmp, name.replace(" ", "_").replace("=", ""))
            cmd = launcher + [os.path.abspath(__file__), "--memory-worker", model_dir, str(length), str(new_tokens),
                              out]
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            ranks = [json.load(open(os.path.join(tmp, f))) for f in os.listdir(tmp)
                     if f.startswith(os.path.basename(out) + ".")]
            res[name] = {"max_rank_peak_growth_mb": max(r["peak_growth"] for r in ranks) / 2**20,
                         "seconds": max(r["seconds"] for r in ranks)}
    res["ratio"] = res["cp=2"]["max_rank_peak_growth_mb"] / res["one process"]["max_rank_peak_growth_mb"]
    return res


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--memory-worker":
        memory_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=DEFAULT_STEPS, help="timed runs per generator")
    ap.add_argument("--warmup", type=int, default=DEFAULT_WARMUP, help="untimed runs per generator first")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    length, batch, new = (512, 4, 16) if args.quick else (args.length, args.batch, args.new_tokens)
    long_len = 8 * length
    with tempfile.TemporaryDirectory() as tmp:
        bench_model_dir(tmp, long_len)
        thr = throughput(tmp, length, batch, new, args.repeats, args.warmup)
        mem = memory(tmp, long_len, new)
    shape = f"{thr['prompt_len']} x {batch}"
    print(markdown_table(["runner", "prompt x batch", "new tokens", "tokens/s (median)", "tokens/s (fastest)"],
                         [["longctx Engine", shape, new, f"{thr['ours_tok_s']:.0f}",
                           f"{thr['ours_tok_s_fastest']:.0f}"],
                          ["transformers generate", shape, new, f"{thr['hf_tok_s']:.0f}",
                           f"{thr['hf_tok_s_fastest']:.0f}"]], "llrrr"))
    print(f"\nspeed ratio (ours / transformers, median): {thr['ratio']:.2f}x; identical greedy tokens: "
          f"{thr['same_tokens']}; {thr['ours']['warmup']} warm-up + {thr['ours']['steps']} timed runs each, "
          "interleaved\n")
    print(markdown_table([f"{long_len}-token prompt + {new} new", "peak RSS growth per rank (MB)", "seconds"],
                         [[name, f"{mem[name]['max_rank_peak_growth_mb']:.0f}", f"{mem[name]['seconds']:.1f}"]
                          for name in ("one process", "cp=2")], "lrr"))
    print(f"\nmemory ratio (cp=2 rank / one process): {mem['ratio']:.2f}")
    if args.json:
        write_json(args.json, {"throughput": thr, "memory": mem})


if __name__ == "__main__":
    main()
