"""parallel.compile=norms_mlp in a process without a working C++ compiler: the compiled modules
warn, then run eager."""
import os
import subprocess
import sys
from pathlib import Path

_FALLBACK = """
import sys, torch
sys.path.insert(0, "tests")
from helpers.model import tiny_model
from longctx.parallel.compiled import compile_pointwise
model, ref = tiny_model("default", "gqa").train(), tiny_model("default", "gqa").train()
compile_pointwise(model, "norms_mlp")
ids = torch.randint(0, 128, (2, 32))
print("max diff", (model(ids) - ref(ids)).abs().max().item())
"""


def test_without_a_cxx_compiler_the_compiled_modules_run_eager(tmp_path):
    """No working C++ compiler (a machine without build tools): a warning, then eager results."""
    env = dict(os.environ, CXX="/nonexistent/g++", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    res = subprocess.run([sys.executable, "-c", _FALLBACK], capture_output=True, text=True, env=env, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert res.returncode == 0, res.stderr[-2000:]
    assert "max diff 0.0" in res.stdout
    assert "InvalidCxxCompiler" in res.stderr
