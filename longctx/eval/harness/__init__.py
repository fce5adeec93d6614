"""longctx in lm-evaluation-harness: a model backend (model.py), its scoring (loglik.py), the
`longctx eval --lm-eval` run (run.py) and the paired comparison with a base model (gate.py).
Needs the `eval` extra (pip install 'longctx[eval]')."""
from longctx.eval.harness.model import LongctxLM, Stopped

__all__ = ["LongctxLM", "Stopped"]
