"""A stage's held-out rows are built in the watchdog's slow phase (the start-up limit, for
collectives too), and the ranks agree before leaving it: a rank that tokenizes for longer than
the short collective timeout does not make its peer's next collective give up, and a rank that
cannot build them stops every rank with its one error line."""
import time

import torch
import torch.distributed as dist

from helpers.cp import run_distributed
from longctx.base.errors import UserError
from longctx.config.validation import ValidationSection
from longctx.parallel.timeouts import set_collective_timeout
from longctx.runtime.watchdog import Watchdog
from longctx.train.validation import HeldOutSet, Validator

SHORT_S = 2.0  # the steady collective timeout; rank 1 builds for 3 times as long


class _Rows(Validator):
    """Rows that rank `slow` takes 3 x SHORT_S to build; for stage 1, rank `fails` cannot."""

    def __init__(self, rank: int, slow: int, fails: int):
        super().__init__(ValidationSection(every=1), [], loss_chunk_size=64, originals=[], multiples=[])
        self.rank, self.slow, self.fails, self.builds = rank, slow, fails, 0

    def heldout(self, si, tokenizer):
        if si not in self._sets:
            self.builds += 1
            if self.rank == self.slow:
                time.sleep(3 * SHORT_S)
            if si == 1 and self.rank == self.fails:
                raise UserError("validation.sources[0].path: /data/heldout.jsonl: unreadable (Permission denied)")
            self._sets[si] = HeldOutSet(si, 8, (8,), [])
        return self._sets[si]


def _worker(rank, world):
    watchdog = Watchdog(rank=rank, world=world, timeout_s=SHORT_S, startup_timeout_s=120, log_path=None,
                        marker_dir=None)  # not started: its phases and limits only
    watchdog.step_done(0.01)  # after the first step: the short collective timeout
    set_collective_timeout(SHORT_S)
    phases = []
    real = watchdog.slow_phase

    def slow_phase(name):
        phases.append(name)
        return real(name)

    validator = _Rows(rank, slow=1, fails=1)
    validator.prepare(0, None, slow_phase)
    ones = torch.ones(1)
    dist.all_reduce(ones)  # the first forward's collective, under the short timeout again
    validator.prepare(0, None, slow_phase)  # built: no phase, no collective
    try:
        validator.prepare(1, None, slow_phase)
        failure = None
    except UserError as e:
        failure = str(e)
    return phases, validator.builds, float(ones), failure


def test_rows_are_built_in_the_slow_phase_and_a_failure_is_every_rank_s():
    for phases, builds, total, failure in run_distributed(_worker, 2, timeout=120):
        assert phases == ["validation rows", "validation rows"]  # stage 0 once, stage 1 once
        assert builds == 2 and total == 2.0
        assert failure == "validation.sources[0].path: /data/heldout.jsonl: unreadable (Permission denied)"
