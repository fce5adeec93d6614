#!/usr/bin/env bash
# Create .venv and install longctx (editable, with the test extra). Idempotent: a stamp
# keyed on pyproject.toml skips the install when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
TORCH_CPU_VERSION="${LONGCTX_TORCH_VERSION:-2.13.0}"
if [ ! -x .venv/bin/python ]; then
  echo "[longctx] creating virtualenv in .venv" >&2
  "$PY" -m venv .venv
fi
stamp=".venv/.longctx-installed"
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
pip_install() { .venv/bin/python -m pip install --disable-pip-version-check -q "$@"; }
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    echo "[longctx] CUDA found: installing the default (CUDA) torch build" >&2
    pip_install torch
  else
    echo "[longctx] no CUDA: installing CPU torch==${TORCH_CPU_VERSION}" >&2
    pip_install "torch==${TORCH_CPU_VERSION}" || pip_install "torch==${TORCH_CPU_VERSION}" --index-url https://download.pytorch.org/whl/cpu
  fi
fi
echo "[longctx] installing longctx[test] into .venv" >&2
pip_install -e ".[test]"
# DeepSpeed's JIT-built op (optimizer offload), once per environment rather than in a job
# (longctx/parallel/ds_ops.py)
.venv/bin/longctx setup >&2 || echo "[longctx] warning: DeepSpeed's op not prebuilt; an offload run builds it on first use" >&2
echo "$want" > "$stamp"
