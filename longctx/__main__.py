import sys

from longctx.runtime import startup

startup.begin(sys.argv[1:])  # before the slow imports: preemption signals recorded, a worker tied to its launcher

from longctx.commands.cli import main  # noqa: E402

code = main()
startup.end()  # the result is decided: a late signal must not change it
sys.exit(code)
