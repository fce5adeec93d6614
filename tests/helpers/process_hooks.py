"""Sitecustomize hooks for tests that signal a run started by a script (slurm/,
launch/torchrun.sh) at a chosen moment: every Python process started with the env these helpers
return patches one longctx module as it is imported. longctx itself reads nothing of this.

- `slow_batches_env`: each `longctx eval` decoding batch touches $BATCH_MARK, then waits a second.
- `held_after_work_env`: once a PreemptionFlag is uninstalled with no signal (the work finished),
  the process touches $AFTER_WORK_MARK.<rank> and waits for $RELEASE before it goes on to exit.
- `signal_in_validation_env`: the Nth held-out sum (train/validation.py) a rank computes sends
  the process a SIGTERM first: a preemption that arrives during a validation, at a known step.
- `counted_syncs_env`: each `train_step` appends "<grad_accum> <host reads> <collectives>" to
  $SYNC_LOG, the reads being the scalar copies device -> host (`aten._local_scalar_dense`:
  item(), float(), bool() of a tensor) made while it ran, the collectives the calls of
  torch.distributed's collective functions (DeepSpeed's included: its comm layer calls them).
- `stalled_data_env`: one rank's training loader stops before a chosen batch, touches
  $STALL_MARK and waits for $RELEASE (a data read stuck on a file system).
- `held_batch_env`: one rank's chosen `longctx eval` decoding batch touches $STALL_MARK and
  waits for $RELEASE before it starts.
- `hung_rendezvous_env`: torchrun's agent, once its workers have ended, hangs in the rendezvous's
  shutdown (as its store calls do against a store on a node it is cut off from).
"""
import textwrap
from pathlib import Path

# {module} is imported through the hook; {patch} runs on it right after
TEMPLATE = """
import importlib.abc, importlib.util, os, pathlib, sys, time

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "{module}":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
{patch}
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hook())
"""

SLOW_BATCHES = """
complete = module.Engine.complete_with_ids

def slow(self, samples):
    pathlib.Path(os.environ["BATCH_MARK"]).touch()
    time.sleep(1.0)
    return complete(self, samples)
module.Engine.complete_with_ids = slow
"""

HELD_AFTER_WORK = """
uninstall = module.PreemptionFlag.uninstall

def held(self):
    uninstall(self)
    if self.received is None:
        pathlib.Path(os.environ["AFTER_WORK_MARK"] + "." + os.environ.get("RANK", "0")).touch()
        deadline = time.monotonic() + 120  # against a hang only
        while not pathlib.Path(os.environ["RELEASE"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
module.PreemptionFlag.uninstall = held
"""

COUNTED_SYNCS = """
from torch.utils._python_dispatch import TorchDispatchMode
import torch

class _Reads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func is torch.ops.aten._local_scalar_dense.default
        return func(*args, **(kwargs or {}))

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
                "broadcast", "reduce", "all_to_all", "all_to_all_single", "barrier", "all_gather_object",
                "broadcast_object_list")
_calls = [0]

def _counting(fn):
    def call(*args, **kwargs):
        _calls[0] += 1
        return fn(*args, **kwargs)
    return call

for _name in _COLLECTIVES:
    _fn = getattr(c10d, _name)
    setattr(c10d, _name, _counting(_fn))
    setattr(dist, _name, getattr(c10d, _name))

step = module.train_step

def counted(engine, model, batches, lr, setup):
    reads = _Reads()
    _calls[0] = 0
    with reads:
        result = step(engine, model, batches, lr, setup)
    with open(os.environ["SYNC_LOG"], "a") as f:
        f.write(f"{setup.grad_accum} {reads.n} {_calls[0]}\\n")
    return result
module.train_step = counted
"""


SIGNAL_IN_VALIDATION = """
import signal
sums = module.heldout_sums
calls = [0]

def signalled(*args, **kwargs):
    calls[0] += 1
    if calls[0] == int(os.environ["SIGNAL_AT_VALIDATION"]):
        os.kill(os.getpid(), signal.SIGTERM)
    return sums(*args, **kwargs)
module.heldout_sums = signalled
"""


def _hook_env(tmp_path: Path, env: dict, module: str, patch: str) -> None:
    """Adds a hook on `module` to env (a second call adds a second hook to the same processes)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(exist_ok=True)
    code = TEMPLATE.format(module=module, patch=textwrap.indent(patch.strip("\n"), " " * 12))
    site = hooks / "sitecustomize.py"
    site.write_text((site.read_text() if site.exists() else "") + code)
    if not env.get("PYTHONPATH", "").startswith(f"{hooks}:"):
        env["PYTHONPATH"] = f"{hooks}:{env.get('PYTHONPATH', '')}"


def slow_batches_env(tmp_path: Path, env: dict) -> Path:
    """Adds the slow-batch hook to env and sets BATCH_MARK; returns the mark file, which exists
    once the first decoding batch has started."""
    _hook_env(tmp_path, env, "longctx.eval.runner", SLOW_BATCHES)
    mark = tmp_path / "batch-started"
    env["BATCH_MARK"] = str(mark)
    return mark


def held_after_work_env(tmp_path: Path, env: dict) -> tuple[Path, Path]:
    """Adds the after-work hook to env; returns (mark prefix, release file): rank r has finished
    its work once `<mark prefix>.r` exists, and waits until the release file exists."""
    _hook_env(tmp_path, env, "longctx.train.signals", HELD_AFTER_WORK)
    mark, release = tmp_path / "after-work", tmp_path / "release"
    env.update(AFTER_WORK_MARK=str(mark), RELEASE=str(release))
    return mark, release


def signal_in_validation_env(tmp_path: Path, env: dict, nth: int) -> None:
    """Adds the hook that SIGTERMs the process as its `nth` validation starts."""
    _hook_env(tmp_path, env, "longctx.train.validation", SIGNAL_IN_VALIDATION)
    env["SIGNAL_AT_VALIDATION"] = str(nth)


def counted_syncs_env(tmp_path: Path, env: dict) -> Path:
    """Adds the host-read counter around train_step to env; returns the log it appends to."""
    _hook_env(tmp_path, env, "longctx.train.step", COUNTED_SYNCS)
    log = tmp_path / "syncs.log"
    env["SYNC_LOG"] = str(log)
    return log


STALLED_DATA = """
build = module.build_stage_loader

class _Held:
    # rank $STALL_RANK's loader: once $STALL_AT_BATCH batches were served, touch $STALL_MARK and
    # wait, as on a stuck file system, until $RELEASE exists
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        for served, batch in enumerate(self.loader):
            if served == int(os.environ["STALL_AT_BATCH"]):
                pathlib.Path(os.environ["STALL_MARK"]).touch()
                deadline = time.monotonic() + 600  # against a hang only
                while not pathlib.Path(os.environ["RELEASE"]).exists() and time.monotonic() < deadline:
                    time.sleep(0.05)
            yield batch

def held(*args, **kwargs):
    loader = build(*args, **kwargs)
    return _Held(loader) if os.environ.get("RANK") == os.environ["STALL_RANK"] else loader
module.build_stage_loader = held
"""


def stalled_data_env(tmp_path: Path, env: dict, rank: int, at_batch: int) -> tuple[Path, Path]:
    """Adds the stalled-loader hook to env: rank `rank`'s training loader stops before batch
    `at_batch` (0-based). Returns (mark, release): the loader is held once the mark exists, and
    goes on once the release file exists."""
    _hook_env(tmp_path, env, "longctx.train.stages", STALLED_DATA)
    mark, release = tmp_path / "data-held", tmp_path / "release"
    env.update(STALL_RANK=str(rank), STALL_AT_BATCH=str(at_batch), STALL_MARK=str(mark), RELEASE=str(release))
    return mark, release


SLOW_DATA = """
build = module.build_stage_loader

class _Slow:
    # every rank's loader: batch $SLOW_AT_BATCH (0-based) takes $SLOW_S seconds more to read
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def __iter__(self):
        for served, batch in enumerate(self.loader):
            if served == int(os.environ["SLOW_AT_BATCH"]):
                time.sleep(float(os.environ["SLOW_S"]))
            yield batch

def slow(*args, **kwargs):
    return _Slow(build(*args, **kwargs))
module.build_stage_loader = slow
"""


def slow_data_env(tmp_path: Path, env: dict, at_batch: int, seconds: float) -> None:
    """Adds the slow-loader hook to env: every rank's batch `at_batch` (0-based) of the training
    loader takes `seconds` more (a slow, not a stuck, step)."""
    _hook_env(tmp_path, env, "longctx.train.stages", SLOW_DATA)
    env.update(SLOW_AT_BATCH=str(at_batch), SLOW_S=str(seconds))


HELD_BATCH = """
complete = module.Engine.complete_with_ids
calls = [0]

def held(self, samples):
    # rank $STALL_RANK's batch number $STALL_AT_BATCH (1-based): touch $STALL_MARK, wait for $RELEASE
    calls[0] += 1
    if os.environ.get("RANK") == os.environ["STALL_RANK"] and calls[0] == int(os.environ["STALL_AT_BATCH"]):
        pathlib.Path(os.environ["STALL_MARK"]).touch()
        deadline = time.monotonic() + 600  # against a hang only
        while not pathlib.Path(os.environ["RELEASE"]).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return complete(self, samples)
module.Engine.complete_with_ids = held
"""


def held_batch_env(tmp_path: Path, env: dict, rank: int, at_batch: int) -> tuple[Path, Path]:
    """Adds the held-batch hook to env: rank `rank` stops before its decoding batch `at_batch`
    (1-based). Returns (mark, release): the batch is held once the mark exists, and goes on
    once the release file exists."""
    _hook_env(tmp_path, env, "longctx.eval.runner", HELD_BATCH)
    mark, release = tmp_path / "batch-held", tmp_path / "release"
    env.update(STALL_RANK=str(rank), STALL_AT_BATCH=str(at_batch), STALL_MARK=str(mark), RELEASE=str(release))
    return mark, release


HUNG_RENDEZVOUS = """
def hung(self, *args, **kwargs):
    time.sleep(600)  # store calls of 60 s each, one after another, to a store that never answers
    return False
module.DynamicRendezvousHandler.{call} = hung
"""
RENDEZVOUS_CALLS = ("shutdown", "num_nodes_waiting")  # after the workers ended; while they run


def hung_rendezvous_env(tmp_path: Path, env: dict, call: str = "shutdown") -> None:
    """Adds the hook to env: torchrun's agent never returns from its rendezvous's `call`: its
    shutdown (the workers have ended and were reaped), or num_nodes_waiting, which the agent
    calls between its looks at the running workers (a worker that exits is then not reaped:
    a zombie child of the agent)."""
    assert call in RENDEZVOUS_CALLS, call
    _hook_env(tmp_path, env, "torch.distributed.elastic.rendezvous.dynamic_rendezvous",
              HUNG_RENDEZVOUS.replace("{call}", call))
