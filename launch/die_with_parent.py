"""`python launch/die_with_parent.py CMD ARGS...`: exec CMD so that it is SIGKILLed when this
process's parent (launch/torchrun.sh) dies (Linux PR_SET_PDEATHSIG, which survives exec).

A SIGKILL to launch/torchrun.sh cannot be trapped; without this its torchrun agent, and the
workers tied to the agent (longctx/runtime/launcher_tie.py), would run on. Elsewhere than Linux the
command is exec'd untied."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from longctx.runtime.launcher_tie import kill_with_parent  # noqa: E402  (the checkout's longctx, stdlib only)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("error: die_with_parent.py: no command given", file=sys.stderr)
        sys.exit(2)
    parent = os.getppid()
    kill_with_parent()
    if os.getppid() != parent:  # the script died before the tie took hold
        sys.exit(137)
    os.execvp(sys.argv[1], sys.argv[1:])
