#!/usr/bin/env bash
# Here, before the GPU calls of the real-model study (docs/real_model.md): cut the SmolLM2 GGUF
# (fetched by scripts/real_model/smollm2.py into its cache) into two parts under models/gguf/ (git-ignored),
# one per device call, with its SHA-256; compress the held-out text to data/longtext/*.xz.
set -euo pipefail
gguf=${GGUF:-${XDG_CACHE_HOME:-$HOME/.cache}/longctx/gguf/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p models/gguf
name=SmolLM2-135M-Instruct.Q4_1.gguf
split -n 2 -a 2 "$gguf" "models/gguf/$name.part-"   # .part-aa, .part-ab: about 49 MB each
(cd "$(dirname "$gguf")" && sha256sum "$name") > "models/gguf/$name.sha256"
for f in data/longtext/heldout.jsonl data/longtext/train.jsonl data/longtext/short.jsonl; do
  [ -f "$f" ] && xz -kf -6 "$f"
done
ls -l models/gguf data/longtext/*.xz 2>/dev/null
