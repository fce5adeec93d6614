"""One module per CLI command: `add_parser(parser)` and `run(args) -> exit code`.

A command's process prints third-party warnings on global rank 0 only: the filters are set
here, before any command module imports torch or DeepSpeed (longctx/third_party_logs.py).
"""
from longctx.third_party_logs import quiet_other_ranks

quiet_other_ranks()
