"""A sitecustomize that slows `longctx eval`'s decoding batches, for tests that signal an eval
launched by a script (slurm/, launch/torchrun.sh) while it runs: every Python process started
with `slow_batches_env` on its PYTHONPATH touches $BATCH_MARK as each decoding batch starts and
then waits a second. longctx itself reads nothing of this."""
import textwrap
from pathlib import Path

SLOW_BATCHES = textwrap.dedent("""
    import importlib.abc, importlib.util, os, pathlib, sys, time

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "longctx.eval.runner":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                complete = module.Engine.complete_with_ids

                def slow(self, samples):
                    pathlib.Path(os.environ["BATCH_MARK"]).touch()
                    time.sleep(1.0)
                    return complete(self, samples)
                module.Engine.complete_with_ids = slow
            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Hook())
""")


def slow_batches_env(tmp_path: Path, env: dict) -> Path:
    """Adds the hook to env's PYTHONPATH and sets BATCH_MARK; returns the mark file, which
    exists once the first decoding batch has started."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SLOW_BATCHES)
    mark = tmp_path / "batch-started"
    env.update(PYTHONPATH=f"{hooks}:{env.get('PYTHONPATH', '')}", BATCH_MARK=str(mark))
    return mark
