"""Package namespaces whose names load their submodule on first access (PEP 562), so that
importing one light submodule (a config dataclass, a validator) does not run the torch imports of
its siblings through the package's __init__."""
from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping, Sequence


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> tuple[Callable[[str], object],
                                                                              Callable[[], list]]:
    """(__getattr__, __dir__) for `package`; `exports` maps each submodule to the names it
    defines that the package offers."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def package_getattr(name: str) -> object:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module_of[name]}"), name)
        setattr(sys.modules[package], name, value)  # later lookups are plain attribute reads
        return value

    def package_dir() -> list:
        return sorted(set(vars(sys.modules[package])) | set(module_of))

    return package_getattr, package_dir


def exported_names(exports: Mapping[str, Sequence[str]]) -> list:
    """The package's __all__."""
    return sorted(name for names in exports.values() for name in names)
