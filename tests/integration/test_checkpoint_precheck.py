"""The safe-load pre-check of a checkpoint's torch files reads their pickles only (no tensor
bytes: a resume reads each partition once, in DeepSpeed's load), refuses a file that would run
code, and works where each node holds its own copy of the checkpoint (no file is assumed to be
visible from another node)."""
import os

import pytest
import torch

from helpers.cp import run_distributed
from longctx.base.errors import UserError
from longctx.checkpoint import store
from longctx.checkpoint.safe_load import check_file, check_files, load_checkpoint_file


class _Payload:
    """Unpickling it runs `touch <marker>`."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _bytes_read() -> int:
    """Bytes this process has read through read() calls so far (Linux)."""
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def test_the_check_reads_the_pickle_and_none_of_the_tensor_bytes(tmp_path):
    big = tmp_path / "optim_states.pt"
    torch.save({"state": {0: {"exp_avg": torch.randn(4_000_000)}}, "step": 3}, big)  # 16 MB of tensor data
    small = tmp_path / "small.pt"
    torch.save({"x": torch.ones(2)}, small)
    check_file(small)  # imports and allow-list built before the count
    before = _bytes_read()
    check_file(big)
    read = _bytes_read() - before
    assert read < 256 * 1024, f"the check read {read} bytes of a {big.stat().st_size}-byte file"
    before = _bytes_read()
    load_checkpoint_file(big)  # the full load reads it all: the count does see file reads
    assert _bytes_read() - before > 15_000_000


def test_the_check_refuses_a_file_that_would_run_code_naming_it(tmp_path):
    marker = tmp_path / "PAYLOAD_RAN"
    bad = tmp_path / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": _Payload(marker), "w": torch.ones(3)}, bad)
    with pytest.raises(UserError, match=rf"^{bad}: refused: it names posix.system"):
        check_files([bad])
    assert not marker.exists()


def test_a_file_in_the_old_unzipped_format_is_still_checked(tmp_path):
    old = tmp_path / "old.pt"
    torch.save({"w": torch.ones(3)}, old, _use_new_zipfile_serialization=False)
    check_file(old)
    torch.save(_Payload(tmp_path / "ran"), old, _use_new_zipfile_serialization=False)
    with pytest.raises(UserError, match="refused"):
        check_file(old)


def _checks(rank, world, shared, node_roots):
    """The pre-check of `shared` (both ranks on this host), then of node_roots with rank r alone
    on host node-r, holding its own copy at node_roots[r]: for each, (the outcome, the files
    this rank checked, its place on its node)."""
    import socket

    checked = []
    real = store.check_files
    store.check_files = lambda files: (checked.extend(str(f) for f in files), real(files))
    results = []
    for root in (shared, node_roots[rank]):
        checked.clear()
        try:
            store.check_torch_files(root)
            outcome = "ok"
        except UserError as e:
            outcome = str(e)
        results.append((outcome, sorted(checked), store.node_place()))
        socket.gethostname = lambda: f"node-{rank}"
    return results


def _checkpoint(root, marker=None):
    (root / "ds").mkdir(parents=True)
    torch.save({"rng": torch.zeros(4)}, root / "rank_00000.pt")
    torch.save({"rng": torch.zeros(4)}, root / "rank_00001.pt")
    torch.save({"module": {"w": torch.ones(3)}}, root / "ds" / "mp_rank_00_model_states.pt")
    payload = _Payload(marker) if marker is not None else torch.zeros(2)
    for r in range(2):
        torch.save({"optimizer_state_dict": payload}, root / "ds" / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    return sorted(str(p) for p in root.rglob("*.pt"))


def test_ranks_share_their_node_s_files_and_each_node_checks_its_own_copy(tmp_path):
    marker = tmp_path / "PAYLOAD_RAN"
    shared = tmp_path / "shared" / "step_0000002"
    roots = [tmp_path / "node0" / "step_0000002", tmp_path / "node1" / "step_0000002"]
    files = [_checkpoint(shared), _checkpoint(roots[0]), _checkpoint(roots[1], marker)]
    (first, local0), (second, local1) = run_distributed(_checks, 2, shared, roots, timeout=180)
    # one node: its two ranks check every file once between them
    assert first[0] == second[0] == "ok" and (first[2], second[2]) == ((0, 2), (1, 2))
    assert not set(first[1]) & set(second[1]) and sorted(first[1] + second[1]) == files[0]
    # two nodes, each with its own copy: every rank checks all of its node's files, none of the
    # other node's; a bad file on node 1 is every rank's one error line, and never runs
    bad = roots[1] / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    assert local0[1] == files[1] and local0[2] == local1[2] == (0, 1)
    for outcome, _, _ in (local0, local1):
        assert outcome.startswith(f"{bad}: refused: it names posix.system"), outcome
    assert not marker.exists()
