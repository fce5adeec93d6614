"""Prefill split across cp=2 ranks (gloo, torchrun) gives the same greedy outputs and the same
perplexities as one process; every rank keeps only its shard of the KV cache."""
import os

import pytest
import torch

import longctx
from helpers.eval_cp import assert_same_outputs, eval_one_and_cp2
from helpers.model import perturb_norms_and_biases
from helpers.train import free_port
from longctx.model import build_model, get_preset


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpmodel")
    cfg = get_preset("debug-tiny", initializer_range=0.2, max_position_embeddings=2048)
    longctx.save_pretrained(build_model(cfg, seed=1), d)
    return d


def _args(model_dir, out):
    return ["--model", str(model_dir), "--tokenizer", "byte", "--suite", "ppl", "--tasks",
            "niah_single_1,niah_multikey_2,passkey", "--lengths", "512,1024", "--samples", "2", "--style", "compact",
            "--max-new-tokens", "8", "--ppl-windows", "1", "--batch-size", "2", "--out", str(out), "--no-progress"]


def test_cp2_prefill_matches_one_process(model_dir, tmp_path):
    a, b = eval_one_and_cp2(lambda out: _args(model_dir, out), tmp_path)
    assert_same_outputs(a, b, n_samples=3 * 2 * 2, new_tokens=8)
    assert b["meta"]["cp"] == 2
    # each rank's cache held about half of the prompt (plus decode slots on the owner rank)
    assert b["meta"]["generation"]["peak_cache_bytes"] > 0


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpqwen3")
    cfg = get_preset("debug-tiny-qwen3", initializer_range=0.2, max_position_embeddings=2048)
    longctx.save_pretrained(perturb_norms_and_biases(build_model(cfg, seed=1), seed=2), d)
    return d


def _worker(rank, port, model_paths, q):
    import torch.distributed as dist

    from longctx.parallel.cp_decode import cp_generate
    from longctx.parallel.mesh import import_before_process_groups, shutdown_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import_before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    outs = []
    for model_path in model_paths:
        model = longctx.load_pretrained(model_path).eval()
        g = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (301, 290, 257)]
        out = {}
        for impl in ("ring", "allgather"):
            out[impl], stats = cp_generate(model, prompts, 12, impl=impl)
        outs.append((out, stats["cache_bytes"]))
    q.put((rank, outs))
    shutdown_distributed(completed=True)


def test_cp_generate_ring_and_allgather_match_single_process(model_dir, qwen3_dir):
    """A Llama and a Qwen3 model (q/k norms in the prefill and in every decode step)."""
    import torch.multiprocessing as mp

    from longctx.model.generate import generate

    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (301, 290, 257)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    paths = [str(model_dir), str(qwen3_dir)]
    procs = [ctx.Process(target=_worker, args=(r, port, paths, q)) for r in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    for i, path in enumerate(paths):
        model = longctx.load_pretrained(path).eval()
        ref = generate(model, prompts, 12)
        cfg = model.config
        full_cache = 2 * cfg.num_hidden_layers * 3 * cfg.num_key_value_heads * 304 * cfg.head_dim * 4
        for rank, outs in results:
            out, cache_bytes = outs[i]
            assert out["ring"] == ref and out["allgather"] == ref, (path, rank)
            assert cache_bytes < 0.6 * full_cache  # a rank never holds the whole prompt's K/V
