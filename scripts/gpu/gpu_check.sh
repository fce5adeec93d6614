#!/usr/bin/env bash
# Device call: the checks that need a GPU (docs/gpu.md has the plan of calls and the results).
#   0. the machine: GPU, torch, the carried packages, which attention kernels import;
#   1. tests/unit/test_device.py on CUDA (model vs transformers, attention backends, checkpointing,
#      generation, training steps), its first JIT compiles (Flex, FlashAttention-4) included;
#   2. the real trainer (`longctx train`, DeepSpeed engine, NCCL, bf16, full checkpointing) at 16k,
#      ZeRO-0 and ZeRO-2, a few steps each, the ZeRO-0 run exported to HF at the end.
# transformers side by side is the next call, scripts/gpu/gpu_bench_train.sh.
#   bash scripts/gpu/gpu_check.sh OUT_DIR        # BUDGET_S (default below): it ends by itself within it
set -uo pipefail
out=${1:-gpu_check_out}
budget_s=${BUDGET_S:-345}
keep="machine.log tests.log train_z0.jsonl train_z2.jsonl"
summary() { $py scripts/gpu/gpu_summary.py check "$out"; }
. "$(dirname "$0")/gpu_env.sh"

train() {  # ZeRO stage, then any more key=value
  local stage=$1; shift
  local run=/tmp/gpu_check/train_z$stage
  rm -rf "$run"
  $py -m longctx train out_dir="$run" model.preset=bench-44m data.seq_len=16384 data.micro_batch_size=1 \
    train.steps=8 train.dtype=bfloat16 parallel.zero_stage="$stage" parallel.activation_checkpointing=full \
    log.progress=false log.tensorboard=false checkpoint.save_hf=false "$@"
  local rc=$?
  cp "$run/metrics.jsonl" "$out/train_z$stage.jsonl" 2>/dev/null
  ls "$run/hf" 2>/dev/null | tr '\n' ' '
  return $rc
}

step machine 30 gpu_facts
cuda_step tests 140 $py -m pytest -q -p no:cacheprovider tests/unit/test_device.py
cuda_step train_z0 45 train 0 checkpoint.export_hf=true
cuda_step train_z2 45 train 2 checkpoint.export_hf=false
