"""`longctx train`'s job as one call: the Trainer (train/loop.py) runs it; a stall, a non-finite
stop or a data or checkpoint error ends it as every rank must see it; the ranks of a completed job
meet at a watched last barrier, then the trainer and the process groups are torn down."""
from __future__ import annotations

import logging
from typing import Optional

from longctx.base.errors import UserError
from longctx.config import RunPlan, TrainConfig
from longctx.parallel.mesh import shutdown_distributed
from longctx.runtime.watchdog import is_collective_timeout, meet_at_end
from longctx.train.loop import Trainer
from longctx.train.nonfinite import NonFiniteStop, report_stop

log = logging.getLogger("longctx.train")


def train(cfg: TrainConfig, plan: Optional[RunPlan] = None) -> int:
    """Run the job of `cfg`; `plan`: validate_config's for it (validated here when not given)."""
    trainer = Trainer(cfg, plan)
    completed = False
    try:
        try:
            rc = trainer.run()
        except NonFiniteStop as e:
            rc = report_stop(e, trainer.rank, trainer.out)
        except RuntimeError as e:
            if is_collective_timeout(e):  # a peer stalled: say which, then end like a lost node
                trainer.watchdog.collective_failed(e)
            raise
        except UserError as e:  # checkpoint or data identity: every rank raises it; the CLI prints rank 0's
            completed = True
            if trainer.rank == 0:
                raise
            log.error("%s", e)
            return 2
        completed = True
        return rc
    finally:
        if completed:
            meet_at_end(trainer.watchdog)
        trainer.close()
        shutdown_distributed(False)  # met at last_barrier above after a completed job

