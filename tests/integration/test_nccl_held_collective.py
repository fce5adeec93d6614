"""A real NCCL collective that one rank holds, where two GPUs are at hand (issue 68): the other
rank's timeout reaches longctx's handler (exit 86, STALLED, a line naming the rank), not NCCL's
SIGABRT. The settings that make it so, and their order against the watch's limits, are tested
in-process (tests/unit/test_nccl_stalls.py)."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from longctx.runtime.watchdog import STALLED_EXIT_CODE

HELD_COLLECTIVE = textwrap.dedent("""
    import os, pathlib, sys, time, torch, torch.distributed as dist
    from longctx.parallel.mesh import init_distributed
    from longctx.runtime.watchdog import Watchdog, is_collective_timeout
    info = init_distributed(timeout_s=60)
    out = pathlib.Path(sys.argv[1])
    w = Watchdog(rank=info.rank, world=2, timeout_s=10.0, startup_timeout_s=60.0, log_path=None,
                 marker_dir=out).start()
    w.new_shape("stage 0")
    x = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    w.step_done(1.0)  # collectives: 10 s from here
    if info.rank == 1:
        w.beat("data", step=2)
        time.sleep(600)  # a data read that never returns
    w.beat("compute", step=2)
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        x.sum().item()
        dist.all_reduce(x)
    except RuntimeError as e:
        if is_collective_timeout(e):
            w.collective_failed(e)
        raise
""")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs (a real NCCL collective between two ranks)")
def test_a_held_nccl_collective_ends_with_86_and_stalled(tmp_path):
    script = tmp_path / "held.py"
    script.write_text(HELD_COLLECTIVE)
    env = dict(os.environ, LOGLEVEL="WARNING")
    for key in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"):
        env.pop(key, None)  # longctx's own settings
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    text = done.stdout + done.stderr
    assert f"exitcode  : {STALLED_EXIT_CODE}" in text, text[-4000:]
    assert "SIGABRT" not in text and "Signal 6" not in text, text[-4000:]
    line = (tmp_path / "STALLED").read_text()
    assert line.startswith("error: stalled:") and "rank 1" in line, line
