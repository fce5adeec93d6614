"""A stand-in for a DeepSpeed op builder whose build takes a while, so build locks can be tested
without compiling: `python fake_op.py build` builds it (appending its pid to builds.log) and
finishes once the file `go` is in the extensions cache; `python fake_op.py hang` never finishes
(to be killed mid-way). The extensions cache is TORCH_EXTENSIONS_DIR, as for the real ops."""
import os
import time

from longctx.parallel import ds_ops

NAME = "fake_op"


class FakeBuilder:
    """Builds like torch's JIT load: under torch's lock file `<op>/lock`, held open while it builds."""
    NAME = NAME

    def __init__(self, wait_for_go: bool):
        self.wait_for_go = wait_for_go

    def load(self, verbose: bool = False) -> None:
        build_dir = ds_ops.extensions_root() / NAME
        build_dir.mkdir(parents=True, exist_ok=True)
        if ds_ops.is_built(NAME):
            return
        fd = os.open(build_dir / "lock", os.O_CREAT | os.O_EXCL)
        with open(ds_ops.extensions_root() / "builds.log", "a") as log:
            log.write(f"{os.getpid()}\n")
        print("building", flush=True)
        deadline = time.time() + 600
        while self.wait_for_go and not (ds_ops.extensions_root() / "go").exists() and time.time() < deadline:
            time.sleep(0.05)
        (build_dir / f"{NAME}.so").write_bytes(b"")
        os.close(fd)
        os.unlink(build_dir / "lock")


if __name__ == "__main__":
    ds_ops.build_once(FakeBuilder(wait_for_go=True), notify=lambda line: print(line, flush=True))
