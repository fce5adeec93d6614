"""The packages whose __init__ loads names on first use (longctx/base/lazy_exports.py): every listed
name resolves to its submodule's object, and importing a light submodule loads no torch."""
import importlib
import subprocess
import sys

import pytest

LAZY_PACKAGES = ["longctx.attention", "longctx.data", "longctx.model", "longctx.parallel"]
LIGHT_MODULES = ["longctx.config", "longctx.data.config", "longctx.data.source_config", "longctx.data.synthetic_config",
                 "longctx.model.config", "longctx.model.hf_config", "longctx.parallel.layout", "longctx.plan",
                 "longctx.eval.config", "longctx.attention.backends"]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_every_exported_name_is_its_submodules_object(package):
    pkg = importlib.import_module(package)
    for name in pkg.__all__:
        value = getattr(pkg, name)
        defining = [m for m, names in pkg._EXPORTS.items() if name in names]
        source = importlib.import_module(f"{package}.{defining[0]}") if defining else pkg
        assert getattr(source, name) is value, (package, name)
        assert name in dir(pkg)


def test_an_unknown_name_is_an_attribute_error_and_submodules_still_import():
    import longctx.model

    with pytest.raises(AttributeError, match=r"module 'longctx.model' has no attribute 'nope'"):
        longctx.model.nope  # noqa: B018
    from longctx.model import loss  # a submodule, not an export: the import system loads it

    assert loss.__name__ == "longctx.model.loss"


def test_light_modules_load_no_torch():
    probe = f"import sys\nfor m in {LIGHT_MODULES!r}: __import__(m)\nprint('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False", res.stderr[-2000:]
