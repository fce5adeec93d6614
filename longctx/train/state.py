"""Where a training run is: the counters the trainer advances and checkpoints."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class TrainState:
    """Where the run is: optimizer steps taken (in all stages), real tokens trained on, the
    stage and the steps taken in it. Checkpointed with the trainer state."""
    step: int = 0
    tokens: int = 0
    stage: int = 0
    stage_step: int = 0
