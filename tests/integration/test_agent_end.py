"""Every launcher ends (issue 75), at the end of a stalled job and at its start:

- a rank stalls and writes STALLED, its worker exits 86, and torchrun's agent then hangs in its
  rendezvous's store calls (as on a node cut off from the store's node, where each call waits
  60 s and another follows). launch/torchrun.sh ends the agent once STALLED is from this run and
  no worker is left: it exits 86 within the stall's own end plus the agent's grace, and leaves no
  process. One process (a rank's own phase limit ends it: no peer, no 30 s grace for another
  worker), parallel.timeout_s=5; test_node_partition.py shows the same end on two network
  namespaces;
- a job of two nodes whose second node never joins (lost during start-up): the launcher gives
  the rendezvous the run's start-up limit as its join timeout, so it ends within that limit
  plus timeout_s, not torchrun's own 600 s."""
import subprocess
import sys
import time

import psutil
import pytest

from helpers.process_hooks import RENDEZVOUS_CALLS, hung_rendezvous_env, stalled_data_env
from helpers.recipes import ROOT
from helpers.stalls import left_running
from helpers.train import TINY, env, free_port

pytestmark = pytest.mark.slow

TIMEOUT_S = 5
AGENT_HANGS_S = 600  # the hook's hang: far past the bound below


@pytest.mark.parametrize("hangs_in", RENDEZVOUS_CALLS)
def test_the_launcher_ends_an_agent_whose_rendezvous_hangs(tmp_path, hangs_in):
    """`hangs_in` num_nodes_waiting: the agent is blocked while its worker still runs, so the
    worker's exit leaves a zombie the agent never reaps (what a CI run of test_node_partition.py
    met on the cut-off node: a launcher that took the zombie for a live worker waited on)."""
    e = dict(env(), LONGCTX_PYTHON=sys.executable, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    mark, release = stalled_data_env(tmp_path, e, rank=0, at_batch=4)  # step 5: past the warm steps' limit
    hung_rendezvous_env(tmp_path, e, hangs_in)
    out, log_path = tmp_path / "run", tmp_path / "launcher.log"
    cmd = [str(ROOT / "launch" / "torchrun.sh"), "--nproc-per-node", "1", "--", "train", *TINY, f"out_dir={out}",
           "train.steps=8", "checkpoint.every=0", "log.every=1", f"parallel.timeout_s={TIMEOUT_S}"]
    job = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, cwd=ROOT, env=e,
                           start_new_session=True)
    tree = []
    try:
        deadline = time.monotonic() + 600  # start-up on a loaded machine; against a hang only
        while not mark.exists() and job.poll() is None and time.monotonic() < deadline:
            tree = psutil.Process(job.pid).children(recursive=True)
            time.sleep(0.05)
        assert mark.exists(), log_path.read_text()[-3000:]
        tree = psutil.Process(job.pid).children(recursive=True)
        held_at = time.monotonic()
        rc = job.wait(timeout=AGENT_HANGS_S / 4)
        ended_after = time.monotonic() - held_at
    finally:
        release.touch()
        if job.poll() is None:
            job.kill()
    text = log_path.read_text()
    assert rc == 86, text[-3000:]
    assert "error: stalled: rank 0 made no progress for " in text, text[-3000:]
    assert "ending torchrun's agent" in text, text[-3000:]  # it did hang: the launcher ended it
    # the rank's limit (timeout_s + 4 x its slowest step), its report, the agent's 5 s grace and
    # 1 s polls; generous for a loaded machine, far below the agent's own hang
    assert ended_after < 120, ended_after
    assert not left_running(tree), text[-3000:]
    assert (out / "STALLED").read_text().startswith("error: stalled: rank 0 made no progress")


def test_a_node_that_never_joins_ends_the_launcher_after_the_startup_limit(tmp_path):
    startup_s, timeout_s = 5, 20
    e = dict(env(), LONGCTX_PYTHON=sys.executable, TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"))
    log_path = tmp_path / "launcher.log"
    cmd = [str(ROOT / "launch" / "torchrun.sh"), "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
           f"127.0.0.1:{free_port()}", "--", "train", *TINY, f"out_dir={tmp_path / 'run'}",
           f"parallel.startup_timeout_s={startup_s}", f"parallel.timeout_s={timeout_s}"]
    job = subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, cwd=ROOT, env=e,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # the preflight on a loaded machine; against a hang only
        while "[torchrun.sh on " not in log_path.read_text() and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = psutil.Process(job.pid).children(recursive=True)
        began = time.monotonic()  # the rendezvous starts: node 1 never comes
        rc = job.wait(timeout=300)
        ended_after = time.monotonic() - began
    finally:
        if job.poll() is None:
            job.kill()
    text = log_path.read_text()
    assert rc != 0 and "RendezvousTimeoutError" in text, text[-3000:]
    assert ended_after < startup_s + timeout_s, (ended_after, text[-3000:])
    assert not left_running(tree), text[-3000:]
