#!/usr/bin/env bash
# The SmolLM2 32k recipe's speed on one GPU: its architecture (smollm2-135m, random weights: the
# recipe without init_from), its 32k rows, packing, document masking, ZeRO-2 and checkpointing,
# with the byte tokenizer over synthetic documents in the recipe's mixture (63% long, 37% short),
# so nothing is needed on disk. `longctx train` runs for TRAIN_S seconds (default 120; SIGTERM at
# the budget), then scripts/gpu/gpu_model_step.py times the model step alone on the same config and
# batches (forward + backward + AdamW, no trainer): the trainer should be within 3% of it.
#   bash scripts/gpu/gpu_recipe_speed.sh OUT_DIR        # about 4 minutes on one H100
# Env: TRAIN_S, STEP_S (model-step budget, default 90), GRAD_ACCUM (default 1), BACKEND
# (parallel.attention_backend, default auto), OVERRIDES (more key=value for both).
# The summary table comes last.
set -uo pipefail
out=${1:-gpu_recipe_out}
mkdir -p "$out"
. "$(dirname "$0")/gpu_env.sh"
gpu_facts 2>&1 | tee "$out/machine.txt"

config=configs/smollm2-135m-32k.yaml
sources="data.sources=[{name: long, kind: synthetic, weight: 0.63, synthetic: {length_min: 8192, length_max: 32768, seed: 1}}, {name: short, kind: synthetic, weight: 0.37, synthetic: {length_min: 256, length_max: 4096, style: short, seed: 2}}]"
common=("model.init_from=null" "data.tokenizer=byte" "$sources" "train.grad_accum=${GRAD_ACCUM:-1}"
        "parallel.attention_backend=${BACKEND:-auto}")
run=/tmp/gpu_recipe/run; rm -rf "$run"

echo "== longctx train: the recipe's shapes for ${TRAIN_S:-120} s"
timeout -s TERM -k 30 "${TRAIN_S:-120}" $py -m longctx train --config $config "out_dir=$run" "${common[@]}" \
  train.steps=100000 checkpoint.every=0 checkpoint.export_hf=false checkpoint.save_hf=false log.progress=false \
  ${OVERRIDES:-} > "$out/train.log" 2>&1
echo "train rc=$? (124/85: stopped at the budget)"; grep -v WARNING "$out/train.log" | tail -4
cp "$run/metrics.jsonl" "$out/train_metrics.jsonl" 2>/dev/null

echo "== the model step alone, same config and batches"
timeout "${STEP_S:-90}" $py scripts/gpu/gpu_model_step.py --config $config "${common[@]}" ${OVERRIDES:-} \
  --steps 8 --warmup 2 --out "$out/model_step.json" > "$out/model_step.log" 2>&1
echo "model step rc=$?"; tail -2 "$out/model_step.log"

$py "$(dirname "$0")/gpu_summary.py" recipe "$out"
