# Sourced by scripts/gpu/gpu_check.sh, gpu_doc_attention.sh and gpu_recipe_speed.sh (not run alone):
# installs the packages carried beside the repository and sets the import path.
#   WHEELS (default .whl): *.whl go to /tmp/site (pip --target, no index); *.tar.xz (wheels too big
#   for one device call, repacked by scripts/gpu/gpu_wheels.sh) are unpacked over them afterwards.
#   /tmp/site/nvidia_cutlass_dsl/dsl_packages joins PYTHONPATH: the cutlass DSL wheel's .pth file
#   does that only in a real site directory, and FlashAttention-4 imports `cutlass` from there.
# Sets py (PYTHON, default python3). Exits 1 when a carried wheel does not install.
py=${PYTHON:-python3}
wheels=${WHEELS:-.whl}
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$wheels"/*.whl || exit 1
fi
for packed in "$wheels"/*.tar.xz; do  # after pip: pip --upgrade replaces a top-level folder it installs
  [ -e "$packed" ] || continue
  mkdir -p /tmp/site && tar -C /tmp/site -xJf "$packed" || exit 1
done
export PYTHONPATH=$PWD:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-} PYTHONUNBUFFERED=1

gpu_facts() {  # the GPU, torch, and which attention kernels import here (one line each)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  $py - <<'PY'
import importlib, platform, torch
cuda = torch.cuda.is_available()
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name() if cuda else None,
      "capability", torch.cuda.get_device_capability() if cuda else None)
for mod in ("triton", "flash_attn", "flash_attn.cute", "cutlass", "transformers", "deepspeed"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod}: {getattr(m, '__version__', 'imports')}")
    except Exception as e:
        print(f"{mod}: no ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
from longctx.attention.dispatch import available_kernels
print("longctx auto kernels:", sorted(available_kernels(torch.device("cuda"))) if cuda else "no CUDA device")
PY
}
