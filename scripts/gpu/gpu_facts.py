"""The machine a GPU script runs on, one line each: python and torch, the GPU, the packages the
scripts use (where each imports from: the device's own or a carried wheel set), and which attention
kernels longctx's `auto` can choose here. flash-attn 2 and FlashAttention-4 both live in a
`flash_attn/` folder: 2 is the package with `flash_attn_interface`, 4 is the namespace folder with
`cute/` (its version from the flash-attn-4 distribution). Run by gpu_env.sh's gpu_facts."""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import platform

import torch

DISTS = {"cutlass": "nvidia-cutlass-dsl", "flash_attn.cute": "flash-attn-4"}

def version_of(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"


def where(path: str | None) -> str:
    """ (the site folder) of a module's file, or nothing."""
    if not path:
        return ""
    return f" ({path.rsplit('/site-packages/', 1)[0] if '/site-packages/' in path else path.rsplit('/', 2)[0]})"


def locate(name: str) -> str:
    """A package's version and folder without importing it (seconds for deepspeed or transformers)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as e:
        return f"no ({type(e).__name__}: {e})"
    if spec is None:
        return "no (not installed)"
    path = spec.origin or next(iter(spec.submodule_search_locations or []), None)
    return f"{version_of(DISTS.get(name, name))}{where(path)}"


def try_import(name: str):
    try:
        return importlib.import_module(name), None
    except Exception as e:  # a missing package, or one built for another CUDA
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def flash_attn_lines() -> list[str]:
    iface, why2 = try_import("flash_attn.flash_attn_interface")
    two = f"flash-attn 2: {version_of('flash-attn')}{where(iface.__file__)}" if iface else f"flash-attn 2: no ({why2})"
    if not torch.cuda.is_available():  # its import (the CuTe DSL, seconds to a minute) is for a GPU's run
        return [two, f"FlashAttention-4 (flash_attn.cute): {locate('flash_attn.cute')}, not imported: no CUDA"]
    cute, why4 = try_import("flash_attn.cute.interface")
    if cute:
        from longctx.attention.varlen_ops import FA4_TESTED
        v = version_of("flash-attn-4")
        pin = "" if v == FA4_TESTED else f" (longctx follows {FA4_TESTED}'s API)"
        four = f"FlashAttention-4 (flash_attn.cute): {v}{pin}{where(cute.__file__)}"
    else:
        four = f"FlashAttention-4 (flash_attn.cute): no ({why4})"
    return [two, four]


def main() -> None:
    cuda = torch.cuda.is_available()
    print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
          "gpu", torch.cuda.get_device_name() if cuda else None,
          "capability", torch.cuda.get_device_capability() if cuda else None)
    for name in ("triton", "cutlass", "transformers", "deepspeed", "omegaconf", "pydantic", "datasets", "pyarrow",
                 "gguf"):
        print(f"{name}: {locate(name)}")
    for line in flash_attn_lines():
        print(line)
    from longctx.attention.dispatch import available_kernels
    print("longctx auto kernels:", sorted(available_kernels(torch.device("cuda"))) if cuda else "no CUDA device")


if __name__ == "__main__":
    main()
