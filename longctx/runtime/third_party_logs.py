"""Third-party warnings once per job, not once per rank.

Every rank runs the same code, so a library's warning (DeepSpeed's "Setting accelerator to
CPU", torch's "No CUDA runtime is found, using CUDA_HOME=...") would print once per process.
On global ranks other than 0, `quiet_other_ranks` drops them before they are emitted:

- records below ERROR of the third-party loggers in QUIETED_LOGGERS (a filter on the logger,
  so it holds from before the library is imported and through the library's own setup);
- Python warnings raised outside longctx (a warnings filter).

Rank 0 prints everything, every rank prints errors and longctx's own warnings and logs.
The command line calls it before any command module loads (longctx/commands/cli.py),
init_distributed before it imports DeepSpeed.
"""
from __future__ import annotations

import logging
import warnings
from typing import Optional

from longctx.runtime.launch_env import read_env

# logger name -> what it prints per rank
QUIETED_LOGGERS = {
    "DeepSpeed": "accelerator detection, deprecations, engine notices (its own stdout handler)",
    "torch.utils.cpp_extension": "'No CUDA runtime is found, using CUDA_HOME=...' when torch is imported",
}
OWN_MODULES = r"longctx(\.|$)"


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def quiet_other_ranks(rank: Optional[int] = None) -> bool:
    """On a rank other than 0 (`rank`, default the launcher's), drop third-party warnings;
    returns whether it did. Safe to call more than once."""
    rank = read_env().rank if rank is None else rank
    if rank == 0:
        return False
    for name in QUIETED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ErrorsOnly) for f in logger.filters):
            logger.addFilter(_ErrorsOnly())
    warnings.filterwarnings("ignore")
    warnings.filterwarnings("default", module=OWN_MODULES)  # inserted first, so it wins
    return True
