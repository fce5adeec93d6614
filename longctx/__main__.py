import sys

from longctx import startup

startup.begin(sys.argv[1:])  # before the slow imports: preemption signals recorded, a worker tied to its launcher

from longctx.cli import main  # noqa: E402

sys.exit(main())
