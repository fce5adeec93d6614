"""OUT/SECTION for answers kept across reruns (lm-eval's request cache, MRCR's records), owned by
one model: OUT/SECTION/identity.json holds the run identity (cells.run_identity), and another
model's answers are refused unless --overwrite replaces them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from longctx.base.errors import UserError
from longctx.storage import atomic


def answers_dir(out: Optional[str], section: str, what: str, identity: Optional[dict], overwrite: bool, main: bool,
                every_rank: bool = False) -> Optional[Path]:
    """OUT/SECTION, made (by the main rank, or by every rank where each writes files of its own) and
    stamped with `identity`; None without --out. `what` names the answers in the error line."""
    if out is None:
        return None
    d = Path(out) / section
    stored = d / "identity.json"
    if identity is not None and stored.is_file() and json.loads(stored.read_text()) != identity:
        if not overwrite:
            raise UserError(f"eval.out: {d} holds another model's {what} answers; use another --out, or --overwrite "
                            "to replace them")
        if main:
            shutil.rmtree(d)
    if main or every_rank:
        d.mkdir(parents=True, exist_ok=True)
    if main and identity is not None:
        atomic.write_json(stored, identity)
    return d
