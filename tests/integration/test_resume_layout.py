"""Resuming on another layout (world size, cp / dp split, ZeRO stage) continues the loss curve:
k steps at layout L1, resumed to N steps at L2, give per-step losses within 1e-5 (fp32) of an
uninterrupted N-step run at L2 -- and a resume that lost the optimizer state does not. A model
of another shape, or another global batch, is refused in one line."""
import pytest

from helpers.layout import LAYOUTS, stopped_at, train_without_moments
from helpers.train import TINY, losses, run_train

K, N = 2, 5  # steps at L1, steps in all (the losses of steps 4 and 5 follow resumed updates)
TOLERANCE = 1e-5  # fp32: layouts of other world sizes differ in the order of their sums (~3e-7 here)
ONE_RANK_TOLERANCE = 1e-6  # one rank at both ends: the same sums (a step counted twice shows as ~6e-6)
# Qwen3's family: its q/k norm weights go through every layout change (universal checkpoints included)
BASE = [*TINY, "model.preset=debug-tiny-qwen3", "optim.schedule=constant", f"train.steps={N}",
        f"checkpoint.every={K}", "checkpoint.keep_last=3"]
CASES = [  # (L1, L2)
    ("2 ranks, ZeRO-1", "1 rank, ZeRO-1"),  # 2 -> 1 processes
    ("1 rank, ZeRO-2", "2 ranks, ZeRO-2"),  # 1 -> 2 processes
    ("2 ranks cp 2, ZeRO-1", "2 ranks, ZeRO-1"),  # cp 2 -> dp 2
    ("1 rank, ZeRO-1", "1 rank, ZeRO-2"),  # ZeRO 1 -> 2
    ("1 rank, ZeRO-2", "1 rank, ZeRO-1"),  # ZeRO 2 -> 1
    ("1 rank, ZeRO-0", "1 rank, ZeRO-2"),  # ZeRO 0 -> 2: the whole optimizer in one file, into partitions
    ("1 rank, ZeRO-1", "1 rank, ZeRO-3"),  # into ZeRO-3's per-parameter partitions
]


def _ok(res):
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each layout's uninterrupted N-step run (checkpoints every K steps), made on first use."""
    runs = {}

    def get(name):
        if name not in runs:
            nproc, args = LAYOUTS[name]
            out = tmp_path_factory.mktemp("layout") / "run"
            _ok(run_train(nproc, [*BASE, *args, f"out_dir={out}"]))
            runs[name] = out
        return runs[name]

    return get


def _stopped_at_k(run, tmp_path):
    return stopped_at(run, tmp_path / "resumed", K)


@pytest.mark.parametrize("old, new", CASES, ids=[f"{a} -> {b}" for a, b in CASES])
def test_a_resume_on_another_layout_continues_the_uninterrupted_losses(tmp_path, uninterrupted, old, new):
    out = _stopped_at_k(uninterrupted(old), tmp_path)
    nproc, args = LAYOUTS[new]
    res = run_train(nproc, [*BASE, *args, f"out_dir={out}", "checkpoint.resume=auto"])
    _ok(res)
    assert "was written at" in res.stderr  # the layout change is said
    resumed, reference = losses(out)[K:], losses(uninterrupted(new))[K:]
    assert len(resumed) == N - K
    one_rank = LAYOUTS[old][0] == LAYOUTS[new][0] == 1
    assert max(abs(a - b) for a, b in zip(resumed, reference)) <= (ONE_RANK_TOLERANCE if one_rank else TOLERANCE)


def test_the_comparison_fails_for_a_resume_without_the_optimizer_state(tmp_path, uninterrupted):
    out = _stopped_at_k(uninterrupted("2 ranks, ZeRO-1"), tmp_path)
    _, args = LAYOUTS["1 rank, ZeRO-1"]
    res = train_without_moments([*BASE, *args, f"out_dir={out}", "checkpoint.resume=auto"])
    _ok(res)
    resumed, reference = losses(out)[K:], losses(uninterrupted("1 rank, ZeRO-1"))[K:]
    assert max(abs(a - b) for a, b in zip(resumed, reference)) > 100 * TOLERANCE


@pytest.mark.parametrize("change, line", [
    (["model.overrides.hidden_size=128"], "holds a model with hidden_size=64; this run's model has hidden_size=128"),
    (["train.grad_accum=1"], "was trained with a global batch of 4 rows per step (2 data-parallel ranks x 2); "
                             "this run's is 2 (1 x 2 micro-batch x 1 grad_accum): set train.grad_accum=2 to keep it"),
])
def test_a_change_that_cannot_resume_is_one_line(tmp_path, uninterrupted, change, line):
    out = _stopped_at_k(uninterrupted("2 ranks, ZeRO-1"), tmp_path)
    _, args = LAYOUTS["1 rank, ZeRO-1"]
    res = run_train(1, [*BASE, *args, *change, f"out_dir={out}", "checkpoint.resume=auto"])
    assert res.returncode == 2
    errors = [x for x in res.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and line in errors[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
