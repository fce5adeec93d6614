#!/usr/bin/env bash
# Device call: where a training step's time goes on one GPU, longctx beside transformers:
# torch.profiler over one step of bench_train.py's model (4 layers of LLaMA-2-7B shape, bf16, full
# checkpointing) at 8k and 32k; each side's top kernels and the time per kind of work.
#   bash scripts/gpu/gpu_profile_step.sh OUT_DIR      # BUDGET_S (default below)
set -uo pipefail
out=${1:-gpu_profile_out}
budget_s=${BUDGET_S:-245}
keep="machine.log profile_8192.json profile_32768.json"
summary() { $py scripts/gpu/gpu_summary.py profile "$out"; }
. "$(dirname "$0")/gpu_env.sh"

profile() {  # T
  $py benchmarks/profile_train_step.py --device cuda --preset llama2-7b --layers 4 --seq-len "$1" --rows 12 \
    --out "$out/profile_$1.json"
}

step machine 30 gpu_facts
cuda_step profile_8192 70 profile 8192
cuda_step profile_32768 70 profile 32768
