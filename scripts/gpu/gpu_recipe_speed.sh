#!/usr/bin/env bash
# Device call: the SmolLM2 32k recipe's speed on one GPU: its architecture (smollm2-135m, random
# weights: the recipe without init_from), its 32k rows, packing, document masking, ZeRO-2 and
# checkpointing, with the byte tokenizer over synthetic documents in the recipe's mixture (63% long,
# 37% short), so nothing is needed on disk and 🤗 datasets is not imported. `longctx train` runs for
# TRAIN_S seconds (SIGTERM at its limit), then scripts/gpu/gpu_model_step.py times the model step
# alone on the same config and batches (forward + backward + AdamW, no trainer): the trainer should
# be within 3% of it.
#   bash scripts/gpu/gpu_recipe_speed.sh OUT_DIR        # BUDGET_S (default below)
# Env: TRAIN_S (default 120), STEP_S (the model step's limit, default 90), GRAD_ACCUM (default 1),
# BACKEND (parallel.attention_backend, default auto), OVERRIDES (more key=value for both).
set -uo pipefail
out=${1:-gpu_recipe_out}
budget_s=${BUDGET_S:-315}
keep="machine.log train_metrics.jsonl model_step.json"
summary() { $py scripts/gpu/gpu_summary.py recipe "$out"; }
. "$(dirname "$0")/gpu_env.sh"

recipe_args() {  # the config and the overrides both sides share, into the array `args`
  local sources="data.sources=[{name: long, kind: synthetic, weight: 0.63, synthetic: {length_min: 8192, length_max: 32768, seed: 1}}, {name: short, kind: synthetic, weight: 0.37, synthetic: {length_min: 256, length_max: 4096, style: short, seed: 2}}]"
  args=(--config configs/smollm2-135m-32k.yaml "model.init_from=null" "data.tokenizer=byte" "$sources"
        "train.grad_accum=${GRAD_ACCUM:-1}" "parallel.attention_backend=${BACKEND:-auto}" ${OVERRIDES:-})
}

train() {
  local run=/tmp/gpu_recipe/run
  rm -rf "$run"
  recipe_args
  $py -m longctx train "${args[@]}" "out_dir=$run" train.steps=100000 checkpoint.every=0 \
    checkpoint.export_hf=false checkpoint.save_hf=false log.progress=false
  local rc=$?
  cp "$run/metrics.jsonl" "$out/train_metrics.jsonl" 2>/dev/null
  return $rc
}
model_step() {
  recipe_args
  $py scripts/gpu/gpu_model_step.py "${args[@]}" --steps 8 --warmup 2 --out "$out/model_step.json"
}

step machine 30 gpu_facts
cuda_step train "${TRAIN_S:-120}" train
cuda_step model_step "${STEP_S:-90}" model_step
