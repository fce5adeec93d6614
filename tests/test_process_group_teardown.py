"""shutdown_distributed really frees the process groups after context-parallel training steps.

A group that outlives destroy_process_group keeps its gloo threads, and they can die in
interpreter shutdown (SIGABRT at exit, seen as a flaky CI failure). The first call of the CP
attention op (a torch.library custom op) imports torch._dynamo, which keeps references to the
groups that exist then; init_distributed imports it first (mesh.import_torch_dynamo_first).
The workers here start like a torchrun job (RANK / WORLD_SIZE in the environment), so the
check covers the trainer's and the eval CLI's path, not the test harness's.
"""
import gc
import json
import os
import weakref

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cp_helpers import _free_port
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
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for rank in range(2):
        alive = json.loads((tmp_path / f"rank{rank}.json").read_text())["alive"]
        assert alive == [], f"rank {rank}: process groups {alive} (0 world, 1 cp, 2 dp) survived shutdown"
