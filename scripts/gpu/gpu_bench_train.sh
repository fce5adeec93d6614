#!/usr/bin/env bash
# Device call: benchmarks/bench_train.py on CUDA, longctx vs transformers (LLaMA-2-7B shapes, 4
# layers, bf16): tokens/s, memory and MFU at 8k and 32k (interleaved), then 128k, each side alone
# (transformers may run out of memory there: a row of the table, not a stop). Each finished row is
# on disk at once, so the table holds whatever finished within the budget.
#   bash scripts/gpu/gpu_bench_train.sh OUT_DIR    # BUDGET_S (default below)
set -uo pipefail
out=${1:-gpu_bench_train_out}
budget_s=${BUDGET_S:-345}
keep="machine.log bench_train_8k_32k.json bench_train_128k_ours.json bench_train_128k_hf.json"
summary() { $py scripts/gpu/gpu_summary.py bench "$out"; }
. "$(dirname "$0")/gpu_env.sh"

bench() {  # name, bench_train args...
  local name=$1; shift
  $py benchmarks/bench_train.py --device cuda --preset llama2-7b --layers 4 --steps 3 --warmup 1 \
    --out "$out/bench_train_$name.json" "$@"
}

step machine 30 gpu_facts
cuda_step bench_train_8k_32k 110 bench 8k_32k --seq-lens 8192,32768 --hf-max-len 32768
cuda_step bench_train_128k_ours 60 bench 128k_ours --seq-lens 131072 --impls ours
cuda_step bench_train_128k_hf 60 bench 128k_hf --seq-lens 131072 --impls hf --hf-max-len 131072
