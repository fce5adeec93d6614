"""A sitecustomize hook for the start-up preemption tests: the trainer's engine build (a slow,
blocking phase of start-up) touches $BUILD_MARK and waits for $RELEASE, so a test can signal the
process while it is inside that call. longctx itself reads nothing of this."""
from pathlib import Path

from helpers.process_hooks import _hook_env

HELD_BUILD = """
build = module.Trainer._build_engine

def held(self):
    pathlib.Path(os.environ["BUILD_MARK"] + "." + os.environ.get("RANK", "0")).touch()
    deadline = time.monotonic() + 120  # against a hang only
    while not pathlib.Path(os.environ["RELEASE"]).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return build(self)
module.Trainer._build_engine = held
"""


def held_build_env(tmp_path: Path, env: dict) -> tuple[Path, Path]:
    """Adds the hook to env; returns (mark prefix, release file): rank r is inside the engine
    build once `<mark prefix>.r` exists, and goes on once the release file exists."""
    _hook_env(tmp_path, env, "longctx.train.loop", HELD_BUILD)
    mark, release = tmp_path / "in-build", tmp_path / "release"
    env.update(BUILD_MARK=str(mark), RELEASE=str(release))
    return mark, release
