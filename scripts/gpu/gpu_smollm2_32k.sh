#!/usr/bin/env bash
# Device calls: the 32k recipe (configs/smollm2-135m-32k.yaml) on one CUDA GPU with its evaluation
# before and after, in two calls on one warm machine (after scripts/gpu/gpu_land.sh has landed the
# GGUF's first part and the trainer's wheels):
#   bash scripts/gpu/gpu_smollm2_32k.sh OUT_DIR zero-shot   # carries the GGUF's part 2 and heldout.jsonl.xz:
#        makes SmolLM2-135M-Instruct, evaluates it with zero-shot YaRN x4 (model_overrides)
#   bash scripts/gpu/gpu_smollm2_32k.sh OUT_DIR train       # carries train.jsonl.xz and short.jsonl.xz:
#        continued pretraining at 32k for TRAIN_S (SIGTERM at the limit: the trainer finishes its
#        step, saves and exits 85), then the trained run evaluated the same way
# Each evaluation is held-out perplexity at 8k/16k/32k and RULER tasks at 32k, within EVAL_S each.
# Needs the model and the text (docs/real_model.md): MODEL (default models/smollm2-135m-instruct,
# made from the GGUF's parts by gpu_study_common.sh) and DATA (default data/longtext). Env: TRAIN_S
# (default 115), EVAL_S (zero-shot default 60, train 35), RULER_TASKS (default
# niah_single_1,niah_multikey_1,vt,fwe), RULER_SAMPLES (default 6), LEN (default 32768), PPL_LENGTHS
# (default 8k,16k,LEN), GRAD_ACCUM (default 4: 131k tokens per step), TRAIN_OVERRIDES.
set -uo pipefail
out=${1:?OUT_DIR}
phase=${2:?PHASE: zero-shot or train}
case $phase in
  zero-shot|train) ;;
  *) echo "error: PHASE: $phase; valid: zero-shot, train" >&2; exit 2 ;;
esac
budget_s=${BUDGET_S:-315}
keep="zero-shot-ppl.json zero-shot-ruler.json trained-ppl.json trained-ruler.json train_metrics.jsonl"
summary() { $py scripts/gpu/gpu_summary.py smollm2 "$out"; }
source scripts/gpu/gpu_study_common.sh
run=${RUN:-runs/smollm2-135m-32k-gpu}
len=${LEN:-32768}

evaluate() {  # name (zero-shot|trained), ppl|ruler, model dir, extra eval args...
  local name=$1 what=$2 dir=$3; shift 3
  local eval_out=/tmp/gpu_smollm2/$name-$what
  if [ "$what" = ppl ]; then
    $py -m longctx eval --model "$dir" --out "$eval_out" --dtype fp32 --no-progress --suite ppl \
      --ppl-data "$data/heldout.jsonl" --lengths "${PPL_LENGTHS:-8k,16k,$len}" --ppl-windows 2 "$@"
  else
    $py -m longctx eval --model "$dir" --out "$eval_out" --dtype fp32 --no-progress \
      --tasks "${RULER_TASKS:-niah_single_1,niah_multikey_1,vt,fwe}" --lengths "$len" \
      --samples "${RULER_SAMPLES:-6}" "$@"
  fi
  local rc=$?
  cp "$eval_out/results.json" "$out/$name-$what.json" 2>/dev/null
  return $rc
}
zero_shot() {  # ppl|ruler
  evaluate zero-shot "$1" "$model" "model_overrides.max_position_embeddings=$len" \
    "model_overrides.rope_parameters={rope_type: yarn, factor: 4.0}"
}
train() {
  $py -m longctx train --config configs/smollm2-135m-32k.yaml "out_dir=$run" "model.init_from=$model" \
    "data.tokenizer=$model" \
    "data.sources=[{name: code-repos, path: $data/train.jsonl, weight: 0.63}, {name: short-files, path: $data/short.jsonl, weight: 0.37}]" \
    "train.grad_accum=${GRAD_ACCUM:-4}" train.steps=1000 checkpoint.every=0 log.progress=false ${TRAIN_OVERRIDES:-}
  local rc=$?
  cp "$run/metrics.jsonl" "$out/train_metrics.jsonl" 2>/dev/null
  return $rc
}

# each step line's `# phase:` is what scripts/gpu/gpu_calls.py counts in that call's budget
if [ "$phase" = zero-shot ]; then
  step model 90 make_model                                      # phase: zero-shot
  step text 20 unpack_text                                      # phase: zero-shot
  cuda_step zero-shot-ppl "${EVAL_S:-60}" zero_shot ppl         # phase: zero-shot
  cuda_step zero-shot-ruler "${EVAL_S:-60}" zero_shot ruler     # phase: zero-shot
else
  step text 20 unpack_text                                      # phase: train
  cuda_step train "${TRAIN_S:-115}" train                       # phase: train
  cuda_step trained-ppl "${EVAL_S:-35}" evaluate trained ppl "$run"      # phase: train
  cuda_step trained-ruler "${EVAL_S:-35}" evaluate trained ruler "$run"  # phase: train
fi
