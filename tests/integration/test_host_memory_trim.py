"""HostMemoryGuard in a process of its own (longctx/runtime/host_memory.py): the free heap pages
pinned between blocks that live on go back to the system once the resident set crept. Moved from
tests/unit/test_host_memory.py, which tests the guard's rule in process: this one needs a fresh
process's heap."""
import json
import os
import subprocess
import sys

import pytest

FRAGMENTED = r"""
import json
from longctx.runtime.host_memory import HostMemoryGuard, rss_bytes

guard = HostMemoryGuard(warmup=1)
guard.after_step()  # the reference: this process before
blocks = [bytearray(16384) for _ in range(12_000)]  # ~190 MiB of heap blocks (below the mmap threshold)
pinned = blocks[::64]  # one block in 64 lives on: the freed ones between cannot leave from the top
del blocks
before = rss_bytes()
guard.after_step()
print(json.dumps({"before": before, "after": rss_bytes(), "trims": guard.trims}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's malloc only")
def test_the_free_pages_between_blocks_that_live_on_go_back_once_the_set_crept():
    res = subprocess.run([sys.executable, "-c", FRAGMENTED], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    found = json.loads(res.stdout.strip().splitlines()[-1])
    assert found["trims"] == 1 and found["after"] < found["before"] - 120 * 2**20, found
