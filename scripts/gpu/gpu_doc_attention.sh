#!/usr/bin/env bash
# Device call: document attention on one GPU: every kernel that imports (torch varlen, flash-attn 2,
# FlashAttention-4, FlexAttention), the sdpa paths and longctx's `auto`, forward + backward, bf16,
# at 32k with 1/16/64 documents (SmolLM2 and Llama-3-8B heads) and 128k with 16 documents; the
# first JIT compiles (FA4, Flex) count in its limit. doc_attention.json gets each row as it
# finishes: the table holds whatever finished within the budget.
#   bash scripts/gpu/gpu_doc_attention.sh OUT_DIR   # BUDGET_S (default below)
set -uo pipefail
out=${1:-gpu_doc_attention_out}
budget_s=${BUDGET_S:-325}
keep="machine.log doc_attention.json"
summary() { $py scripts/gpu/gpu_summary.py doc "$out"; }
. "$(dirname "$0")/gpu_env.sh"

step machine 30 gpu_facts
cuda_step bench 230 $py benchmarks/bench_doc_attention.py --device cuda --dtype bfloat16 \
  --cases 32768:1/16/64,131072:16 --shapes 9/3x64,32/8x128 --warmup 2 --repeats 5 --out "$out/doc_attention.json"
