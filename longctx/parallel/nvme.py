"""Whether NVMe offload (ZeRO-Infinity's parameter offload, `parallel.offload_params_device: nvme`)
can run here, checked at config validation: this module imports neither torch nor DeepSpeed until
the check runs, so config checks stay light (tests/integration/test_lazy_exports.py)."""
from __future__ import annotations

from longctx.base.errors import UserError


def check_async_io(field: str) -> None:
    """DeepSpeed's async_io op (NVMe offload, ZeRO-Infinity) can be built here: it needs libaio
    (apt install libaio-dev) and a compiler; one UserError line naming `field` otherwise."""
    from deepspeed.accelerator import get_accelerator  # lazy: DeepSpeed imports torch; only nvme runs pay it

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        raise UserError(f"{field}: nvme needs DeepSpeed's async_io op, which cannot be built on this machine "
                        "(install libaio-dev and a C++ compiler), or use offload_params_device=cpu")
