"""shutdown_distributed really frees the process groups: after CP steps, and after train().

A group that outlives destroy_process_group keeps its gloo threads, and they can die in
interpreter shutdown (SIGABRT at exit, seen as a flaky CI failure). Importing torch._dynamo
(done lazily by the first call of the CP attention op, a torch.library custom op) or
DeepSpeed keeps references to the groups that exist at that moment, so init_distributed
imports them first (mesh.import_before_process_groups), and shutdown_distributed lets
DeepSpeed drop its own references. The workers start like a torchrun job (RANK / WORLD_SIZE
in the environment), so the checks cover the trainer's and the eval CLI's path.
"""
import gc
import json
import os
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.train import free_port
from longctx.model import build_model, get_preset
from longctx.parallel import make_cp_attention, shard_batch
from longctx.parallel.mesh import build_mesh, init_distributed, shutdown_distributed


def _worker(rank, world, port, outdir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    init_distributed(timeout_s=120)
    mesh = build_mesh(cp_size=world)
    groups = [weakref.ref(g) for g in (dist.group.WORLD, mesh.cp_group, mesh.dp_group)]
    cfg = get_preset("debug-tiny")
    ids = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    batch = shard_batch({"input_ids": ids, "segment_ids": (torch.arange(32) >= 20).long().expand(2, 32)},
                        rank, world)
    model = build_model(cfg, seed=0)
    model.set_attention(make_cp_attention(mesh.cp_group, impl="ring"))
    for _ in range(2):  # forward + backward through the CP attention op, twice
        model(batch["input_ids"], position_ids=batch["position_ids"], segment_ids=batch["segment_ids"]).sum().backward()
    del model, mesh
    shutdown_distributed(completed=True)
    gc.collect()
    alive = [i for i, g in enumerate(groups) if g() is not None]
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"alive": alive}, f)


def test_shutdown_frees_every_process_group_after_cp_steps(tmp_path):
    mp.start_processes(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        alive = json.loads((tmp_path / f"rank{rank}.json").read_text())["alive"]
        assert alive == [], f"rank {rank}: process groups {alive} (0 world, 1 cp, 2 dp) survived shutdown"


def _gloo_threads() -> list[str]:
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return [n for n in names if "gloo" in n]


def _train_worker(rank, world, port, outdir, overrides):
    from longctx.config import load_config
    from longctx.train.entry import train

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    rc = train(load_config(None, [f"out_dir={outdir}/run", "train.steps=2", "data.micro_batch_size=2",
                                  "log.progress=false", "log.tensorboard=false", "checkpoint.save_hf=false",
                                  "checkpoint.export_hf=false", *overrides]))
    gc.collect()
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump({"rc": rc, "gloo_threads": _gloo_threads()}, f)


def _train_and_count(tmp_path, overrides):
    mp.start_processes(_train_worker, args=(2, free_port(), str(tmp_path), overrides), nprocs=2, start_method="spawn")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_trainer_frees_every_process_group(tmp_path):
    """The trainer's path (DeepSpeed imported before the first group, the ZeRO-2 engine
    destroyed, DeepSpeed's own group references dropped at shutdown): no gloo thread is left
    once train() returns."""
    for rank, res in enumerate(_train_and_count(tmp_path, ["parallel.cp_size=2", "parallel.zero_stage=2"])):
        assert res["rc"] == 0 and res["gloo_threads"] == [], f"rank {rank}: {res}"


@pytest.mark.xfail(strict=True, reason="known: a DeepSpeed ZeRO-3 engine outlives train() even after destroy() "
                                       "(a reference Python's gc cannot see) and keeps its groups; they end "
                                       "with the process")
def test_trainer_with_zero3_frees_every_process_group(tmp_path):
    for rank, res in enumerate(_train_and_count(tmp_path, ["parallel.cp_size=2", "parallel.zero_stage=3"])):
        assert res["rc"] == 0 and res["gloo_threads"] == [], f"rank {rank}: {res}"
