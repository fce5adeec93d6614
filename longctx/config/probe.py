"""`validation.probe`: a teacher-forced retrieval probe in every validation (longctx/train/probe.py).

Its fields carry `longctx eval`'s names and meanings (tasks, lengths, samples, seed, style), so
a probe cell holds the samples `longctx eval mode=teacher_forced` builds with the same values.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from longctx.base.errors import UserError
from longctx.eval.lengths import parse_lengths
from longctx.eval.tasks import STYLES, TASKS, TaskOptions

FIELD = "validation.probe"


@dataclass
class ProbeSection:
    tasks: List[str] = field(default_factory=list)  # eval task names; empty: no probe
    # eval-style lengths ("4k"); null: the stage's seq_len and the model's original context
    lengths: Optional[List[str]] = None
    samples: int = 4  # per task and length (random needle placement)
    seed: int = 0  # eval.seed: the samples
    style: str = "ruler"  # eval.style: ruler | compact

    @property
    def enabled(self) -> bool:
        return bool(self.tasks)

    def validate(self, validation_every: int) -> None:
        """The section's own fields (no tokenizer, any stage)."""
        for name, minimum in (("samples", 1), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise UserError(f"{FIELD}.{name}: must be an integer >= {minimum}, got {value!r}")
        if self.style not in STYLES:
            raise UserError(f"{FIELD}.style: {self.style!r} is not a style; valid: {', '.join(STYLES)}")
        for task in self.tasks:
            if task not in TASKS:
                raise UserError(f"{FIELD}.tasks: unknown task {task!r}; valid: {', '.join(TASKS)}")
            reason = TASKS[task].unavailable_reason(TaskOptions(style=self.style))
            if reason:
                raise UserError(f"{FIELD}.tasks: {task} cannot run in a probe ({reason})")
        if self.lengths is not None:
            parse_lengths(self.lengths, f"{FIELD}.lengths")
        if self.enabled and validation_every == 0:
            raise UserError(f"{FIELD}.tasks: a probe runs in each validation; set validation.every > 0, or "
                            "leave validation.probe.tasks empty")

    def stage_lengths(self, seq_len: int, original: int) -> List[int]:
        """The probe's lengths at a stage of `seq_len` tokens whose model's original context is
        `original` (the default: both, the original capped at seq_len)."""
        if self.lengths is None:
            return sorted({min(original, seq_len), seq_len})
        return parse_lengths(self.lengths, f"{FIELD}.lengths")


def original_context(model_config, origin) -> int:
    """The context the model had before its extension: the stage's RoPE
    original_max_position_embeddings, else the origin's max_position_embeddings."""
    return int(model_config.rope_parameters.get("original_max_position_embeddings")
               or origin.max_position_embeddings)


def check_probe_lengths(section: ProbeSection, stages) -> None:
    """Given probe lengths fit every stage's rows (portable: no tokenizer)."""
    if not section.enabled or section.lengths is None:
        return
    longest = section.stage_lengths(1, 1)[-1]
    for stage in stages:
        if longest > stage.seq_len:
            raise UserError(f"{FIELD}.lengths: {longest} is beyond the length of stage {stage.index} "
                            f"({stage.field_names['seq_len']}={stage.seq_len}); give lengths <= {stage.seq_len}")
