"""The trainer's host memory stays flat when its tensors change size from step to step (rows with
their unscored tails cut): a workload shaped like the demo extension's steps (activations of a
random row length each step, a few small allocations kept) holds its resident set from step 50
to step 300 within 5% with HostMemoryGuard.after_step() after each step, as the trainer calls
it. Without it glibc's heap fragments and the same workload grows by a third or more
(longctx/runtime/host_memory.py)."""
import json
import os
import subprocess
import sys

import pytest

WORKLOAD = r"""
import json, random, sys
import torch
from longctx.runtime.host_memory import HostMemoryGuard, rss_bytes

guard = HostMemoryGuard() if sys.argv[1] == "guarded" else None
torch.set_num_threads(1)
rng, kept, marks = random.Random(0), [], {}
for step in range(300):
    T = rng.choice(range(256, 1025, 32))  # this step's row length, (4, T) rows
    acts = [torch.empty(4, T, 688) for _ in range(3)] + [torch.empty(4, T, 256) for _ in range(5)]
    for a in acts:
        a.fill_(1.0)
    kept.append(torch.empty(rng.randint(8, 200)))  # small things that live on (metrics, caches)
    del acts
    if guard is not None:
        guard.after_step()
    if step in (50, 299):
        marks[step] = rss_bytes()
print(json.dumps({"marks": marks, "trims": guard.trims if guard else 0}))
"""

linux_glibc = pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                                 reason="glibc's malloc only")


def _workload(mode: str) -> dict:
    res = subprocess.run([sys.executable, "-c", WORKLOAD, mode], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@linux_glibc
def test_the_guard_keeps_the_resident_set_flat_over_varying_shapes():
    guarded, control = _workload("guarded"), _workload("control")
    assert guarded["marks"]["299"] <= 1.05 * guarded["marks"]["50"], guarded
    assert 0 < guarded["trims"] < 300 // 4, guarded  # only when the set grew, not every step
    assert control["marks"]["299"] > 1.3 * control["marks"]["50"], control  # what it prevents


def test_the_guard_does_nothing_without_glibc(monkeypatch):
    from longctx.runtime import host_memory

    monkeypatch.setattr(host_memory, "_glibc", lambda: None)
    guard = host_memory.HostMemoryGuard()
    guard.after_step()
    guard.after_step()
    assert guard.reference == 0 and guard.trims == 0
