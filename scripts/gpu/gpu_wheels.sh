#!/usr/bin/env bash
# Download, on a machine with the package index, the wheels the GPU scripts install on a device
# without network (FlashAttention-4 and its CuTe DSL stack), into WHEELS (default .whl, git-ignored).
# A wheel over SPLIT_MB (default 40) is unpacked and repacked as NAME.tar.xz (scripts/gpu/gpu_env.sh
# unpacks it into /tmp/site): one device call carries at most 64 MiB.
#   bash scripts/gpu/gpu_wheels.sh            # PY_VERSION (default 3.11: the device's python), PLATFORM
set -euo pipefail
dest=${WHEELS:-.whl}
py=${PYTHON:-python3}
split_mb=${SPLIT_MB:-40}
packages=(flash-attn-4 nvidia-cutlass-dsl nvidia-cutlass-dsl-libs-base nvidia-cutlass-dsl-libs-core
          nvidia-cutlass-dsl-libs-cu13 quack-kernels apache-tvm-ffi torch-c-dlpack-ext)
mkdir -p "$dest"
$py -m pip download -q --pre --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.11}" \
  --platform "${PLATFORM:-manylinux_2_28_x86_64}" -d "$dest" "${packages[@]}"
for whl in "$dest"/*.whl; do
  [ "$(stat -c %s "$whl")" -gt $((split_mb * 1024 * 1024)) ] || continue
  tmp=$(mktemp -d)
  if command -v unzip >/dev/null; then unzip -q "$whl" -d "$tmp"; else $py -m zipfile -e "$whl" "$tmp"; fi
  XZ_OPT=-6 tar -C "$tmp" -cJf "$dest/$(basename "$whl" .whl).tar.xz" .
  rm -rf "$tmp" "$whl"
done
ls -l "$dest"
du -ch "$dest"/* | tail -1
