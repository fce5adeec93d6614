"""The checkpoint manifest when each node sees only its own files (issue 75, item 7):
longctx/checkpoint/manifest.py's collective write and verification, run by four "ranks" on two
"nodes" -- threads of this process, each node's pair with a directory of its own, their
collectives a barrier -- and on one shared directory, as before."""
import json
import threading
from pathlib import Path

import pytest

from longctx.checkpoint import manifest
from longctx.checkpoint.manifest import MANIFEST, shares, verify_collective, write_manifest

WORLD = 4


class _Threads:
    """A process group of threads: `rank_and_world` and `gather_objects` as manifest.py calls them."""

    def __init__(self, world: int):
        self.world, self.slots = world, [None] * world
        self.barrier = threading.Barrier(world, timeout=30)
        self.local = threading.local()

    def rank_and_world(self):
        return self.local.rank, self.world

    def gather_objects(self, obj):
        self.slots[self.local.rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out

    def run(self, fn, dirs: list[Path]) -> list:
        """fn(dirs[rank]) on every rank at once; each rank's answer."""
        answers = [None] * self.world

        def one(rank):
            self.local.rank = rank
            answers[rank] = fn(dirs[rank])

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return answers


@pytest.fixture
def group(monkeypatch):
    g = _Threads(WORLD)
    monkeypatch.setattr(manifest, "rank_and_world", g.rank_and_world)
    monkeypatch.setattr(manifest, "gather_objects", g.gather_objects)
    return g


def _node_local(tmp_path) -> list[Path]:
    """Node 0 (ranks 0, 1) and node 1 (ranks 2, 3), each with its ranks' files only."""
    nodes = [tmp_path / "node0" / "step_0000004", tmp_path / "node1" / "step_0000004"]
    for node, ckpt in enumerate(nodes):
        (ckpt / "ds").mkdir(parents=True)
        for rank in (2 * node, 2 * node + 1):
            (ckpt / "ds" / f"zero_pp_rank_{rank}_optim_states.pt").write_bytes(bytes([rank]) * (100 + rank))
    (nodes[0] / "ds" / "mp_rank_00_model_states.pt").write_bytes(b"weights")
    (nodes[0] / "trainer_state.json").write_text('{"step": 4}')
    return [nodes[0], nodes[0], nodes[1], nodes[1]]


def test_node_local_directories_get_one_manifest_of_every_file(group, tmp_path):
    dirs = _node_local(tmp_path)
    assert group.run(lambda d: write_manifest(d, 4), dirs) == [None] * WORLD
    copies = [json.loads((d / MANIFEST).read_text()) for d in (dirs[0], dirs[2])]
    assert copies[0] == copies[1]  # the same manifest in each node's directory
    assert sorted(copies[0]["files"]) == ["ds/mp_rank_00_model_states.pt",
                                          *[f"ds/zero_pp_rank_{r}_optim_states.pt" for r in range(WORLD)],
                                          "trainer_state.json"]
    assert copies[0]["files"]["ds/zero_pp_rank_3_optim_states.pt"]["size"] == 103
    assert not list(tmp_path.rglob(f".{MANIFEST}.*"))  # no temporary left
    assert group.run(verify_collective, dirs) == [None] * WORLD


@pytest.mark.parametrize("fault, expected", [
    ("corrupt", "ds/zero_pp_rank_2_optim_states.pt fails its SHA-256 check (corrupted)"),
    ("truncate", "ds/zero_pp_rank_2_optim_states.pt has 50 bytes, the manifest says 102 (truncated or rewritten)"),
    ("lose", "ds/zero_pp_rank_2_optim_states.pt is missing"),
    ("older copy", f"the copies of {MANIFEST} that the ranks see differ"),
])
def test_a_fault_on_one_node_fails_every_ranks_verification(group, tmp_path, fault, expected):
    dirs = _node_local(tmp_path)
    assert group.run(lambda d: write_manifest(d, 4), dirs) == [None] * WORLD
    shard = dirs[2] / "ds" / "zero_pp_rank_2_optim_states.pt"
    if fault == "corrupt":
        shard.write_bytes(bytes([9]) * 102)  # same size, other bytes
    elif fault == "truncate":
        shard.write_bytes(bytes([2]) * 50)
    elif fault == "lose":
        shard.unlink()
    else:
        body = json.loads((dirs[2] / MANIFEST).read_text())
        body["files"].pop("trainer_state.json")
        (dirs[2] / MANIFEST).write_text(json.dumps(body))
    answers = group.run(verify_collective, dirs)
    assert all(a is not None and a.startswith(expected) for a in answers), answers
    assert len(set(answers)) == 1  # the same answer on every rank


def test_a_shared_directory_is_written_once_and_split_as_before(group, tmp_path):
    ckpt = tmp_path / "step_0000002"
    (ckpt / "ds").mkdir(parents=True)
    for rank in range(WORLD):
        (ckpt / "ds" / f"zero_pp_rank_{rank}_optim_states.pt").write_bytes(b"x" * (rank + 1))
    assert group.run(lambda d: write_manifest(d, 2), [ckpt] * WORLD) == [None] * WORLD
    assert len(json.loads((ckpt / MANIFEST).read_text())["files"]) == WORLD
    assert group.run(verify_collective, [ckpt] * WORLD) == [None] * WORLD
    names = [f"f{i}" for i in range(6)]
    assert shares(names, [set(names)] * 3) == {0: ["f0", "f3"], 1: ["f1", "f4"], 2: ["f2", "f5"]}


def test_each_file_is_hashed_by_a_rank_that_sees_it():
    seen = [{"a", "b"}, {"a", "b"}, {"c"}, set()]
    assigned = shares(["a", "b", "c", "gone"], seen)
    assert assigned == {0: ["a"], 1: ["b"], 2: ["c"], 3: []}  # "gone": no rank sees it, no share
