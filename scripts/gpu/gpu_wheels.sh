#!/usr/bin/env bash
# Here, with the package index: the wheels the device calls carry (the lent machines have no network
# and lack these; docs/gpu.md's plan of calls says which call carries what). cp312 manylinux x86_64,
# every version pinned, into WHEELS (default .whl, git-ignored), one folder per set:
#   .whl/trainer  what `longctx train` and eval need beside the device's own packages: DeepSpeed
#                 (built here as a wheel: its releases are source-only), omegaconf >= 2.4 (no antlr
#                 runtime), pydantic and the rest they need, 🤗 datasets (only file sources import it),
#                 gguf (the SmolLM2 GGUF conversion);
#   .whl/fa4      FlashAttention-4 and its CuTe DSL stack, less its CUDA 13 libraries;
#   .whl/parts    those libraries (nvidia-cutlass-dsl-libs-cu13, 92 MB as a wheel, 237 MB unpacked),
#                 unpacked and repacked with xz (63 MiB), cut in two pieces of at most PIECE_MIB,
#                 with a .parts manifest: one call cannot carry them beside the repository, so two
#                 consecutive calls on a warm machine carry one piece each and gpu_env.sh joins them.
#   bash scripts/gpu/gpu_wheels.sh          # then: python scripts/gpu/gpu_calls.py check --strict
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${WHEELS:-.whl}
py=${PYTHON:-python3}
piece_mib=${PIECE_MIB:-33}   # scripts/gpu/gpu_calls.py counts each piece at this
deepspeed=deepspeed==0.19.8
trainer=(omegaconf==2.4.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
         typing-extensions==4.16.0 hjson==3.1.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 gguf==0.19.0)
fa4=(flash-attn-4==4.0.0b40 quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
     nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1)
big=nvidia-cutlass-dsl-libs-cu13==4.8.1
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux1_x86_64; do platforms+=(--platform "$p"); done
download() {  # folder, requirements...
  local to=$1; shift
  $py -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$to" "$@"
}
mkdir -p "$dest/trainer" "$dest/fa4" "$dest/parts"
rm -f "$dest"/trainer/*.whl "$dest"/fa4/*.whl "$dest"/parts/*

echo "== trainer: $deepspeed built here (DS_BUILD_OPS=0: its ops are JIT-built where they run), then ${trainer[*]}"
DS_BUILD_OPS=0 $py -m pip wheel -q --no-deps -w "$dest/trainer" "$deepspeed"
download "$dest/trainer" "${trainer[@]}"

echo "== fa4: ${fa4[*]}"
download "$dest/fa4" "${fa4[@]}"

echo "== parts: $big, repacked with xz and cut in two"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download "$tmp" "$big"
whl=$(ls "$tmp"/*.whl)
name=$(basename "$whl" .whl).tar.xz
mkdir "$tmp/unpacked"
$py -m zipfile -e "$whl" "$tmp/unpacked"
XZ_OPT="-6 -T0" tar -C "$tmp/unpacked" -cJf "$tmp/$name" .
(cd "$tmp" && split -n 2 -a 2 "$name" "$name.part-")
for piece in "$tmp/$name".part-*; do
  if [ "$(stat -c %s "$piece")" -gt $((piece_mib * 1024 * 1024)) ]; then
    echo "error: $piece: over PIECE_MIB ($piece_mib MiB); the calls that carry it would not fit" >&2; exit 1
  fi
done
mv "$tmp/$name".part-* "$dest/parts/"
{ echo fa4
  (cd "$dest/parts" && sha256sum "$name".part-*)
  (cd "$tmp" && sha256sum "$name")
} > "$dest/parts/$name.parts"

du -b "$dest"/trainer/*.whl "$dest"/fa4/*.whl "$dest"/parts/* | awk '{printf "%8.2f MiB  %s\n", $1 / 1048576, $2}'
