"""Prefill split across cp=2 ranks (gloo, torchrun) gives the same greedy outputs and the same
perplexities as one process; every rank keeps only its shard of the KV cache."""
import os

import pytest
import torch

import longctx
from helpers.eval_cp import assert_same_outputs, eval_one_and_cp2
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


def _worker(rank, port, model_path, q):
    import torch.distributed as dist

    from longctx.parallel.cp_decode import cp_generate
    from longctx.parallel.mesh import import_before_process_groups, shutdown_distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import_before_process_groups()
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = longctx.load_pretrained(model_path).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (301, 290, 257)]
    out = {}
    for impl in ("ring", "allgather"):
        out[impl], stats = cp_generate(model, prompts, 12, impl=impl)
    q.put((rank, out, stats["cache_bytes"]))
    shutdown_distributed(completed=True)


def test_cp_generate_ring_and_allgather_match_single_process(model_dir):
    import torch.multiprocessing as mp

    from longctx.model.generate import generate

    model = longctx.load_pretrained(model_dir).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (301, 290, 257)]
    ref = generate(model, prompts, 12)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, str(model_dir), q)) for r in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    cfg = model.config
    full_cache = 2 * cfg.num_hidden_layers * 3 * cfg.num_key_value_heads * 304 * cfg.head_dim * 4
    for rank, out, cache_bytes in results:
        assert out["ring"] == ref and out["allgather"] == ref
        assert cache_bytes < 0.6 * full_cache  # a rank never holds the whole prompt's K/V
