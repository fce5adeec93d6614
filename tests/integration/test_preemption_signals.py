"""PreemptionFlag's handlers once the work finished: a late SIGUSR1 does not kill the process
(its default action would fail a finished run), SIGTERM's default and a caller's own handler come
back, and a shell started afterwards can still trap SIGUSR1 (the launchers' time budgets)."""
import subprocess
import sys
import textwrap

FINISHED_THEN_SIGNALLED = textwrap.dedent("""
    import os, signal
    from longctx.train.signals import PreemptionFlag

    flag = PreemptionFlag().install()
    flag.uninstall()  # the work finished without a signal
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    os.kill(os.getpid(), signal.SIGUSR1)  # SLURM's warning or a time budget, just too late
    print("alive after SIGUSR1")
""")

USER_HANDLER = textwrap.dedent("""
    import os, signal, time
    from longctx.train.signals import PreemptionFlag

    def mine(signum, frame):
        print("caller's handler", flush=True)

    signal.signal(signal.SIGUSR1, mine)
    flag = PreemptionFlag().install()
    flag.uninstall()
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.1)
""")

CHILD_SHELL_TRAPS = textwrap.dedent("""
    import subprocess
    from longctx.train.signals import PreemptionFlag

    flag = PreemptionFlag().install()
    flag.uninstall()
    # what a test suite that ran a trainer in-process does next: start a launcher that traps USR1
    out = subprocess.run(["bash", "-c", "trap 'echo trapped' USR1; kill -USR1 $$; echo done"],
                         capture_output=True, text=True, timeout=60)
    print(out.stdout.strip().replace(chr(10), " "), out.returncode)
""")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_late_sigusr1_does_not_kill_a_finished_run():
    res = _run(FINISHED_THEN_SIGNALLED)
    assert res.returncode == 0, (res.returncode, res.stderr[-2000:])
    assert res.stdout.strip() == "alive after SIGUSR1"


def test_a_callers_own_sigusr1_handler_is_restored():
    res = _run(USER_HANDLER)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "caller's handler"


def test_a_shell_started_after_the_work_still_traps_sigusr1():
    res = _run(CHILD_SHELL_TRAPS)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "trapped done 0"
