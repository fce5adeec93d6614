#!/usr/bin/env bash
# Document attention on one GPU: every kernel that imports (torch varlen, flash-attn 2,
# FlashAttention-4, FlexAttention), the sdpa paths and longctx's `auto`, forward + backward, bf16,
# at 32k with 1/16/64 documents (SmolLM2 and Llama-3-8B heads) and 128k with 16 documents.
#   bash scripts/gpu/gpu_doc_attention.sh OUT_DIR      # under 5 minutes on one H100 (timeout 280 s)
# The table comes last; OUT_DIR/doc_attention.json keeps every finished row even after a timeout.
set -uo pipefail
out=${1:-gpu_doc_attention_out}
mkdir -p "$out"
. "$(dirname "$0")/gpu_env.sh"
gpu_facts 2>&1 | tee "$out/machine.txt"
timeout -k 10 "${LIMIT_S:-280}" $py benchmarks/bench_doc_attention.py --device cuda --dtype bfloat16 \
  --cases 32768:1/16/64,131072:16 --shapes 9/3x64,32/8x128 --warmup 2 --repeats 5 \
  --out "$out/doc_attention.json" 2>&1 | tee "$out/doc_attention.txt" | tail -16
echo "rc=${PIPESTATUS[0]}"
