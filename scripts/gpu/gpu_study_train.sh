#!/usr/bin/env bash
# Device call: the study's training at 64k and its control (issue 53), each evaluated on the same
# machine right after it trains (weights stay on the machine; cells and report come back in OUT).
#   bash scripts/gpu/gpu_study_train.sh OUT_DIR [trained|control|both]
# trained: configs/smollm2-135m-32k.yaml at seq_len 65536 with YaRN x8, the ProLong-style mix
#   (code repositories 0.63 + short files 0.37), grad_accum 2 (131k tokens per step), TRAIN_S
#   seconds (default 150; SIGTERM: finishes its step, saves, exits 85).
# control: the same steps and tokens per step at 8k (grad_accum 16) with the shipped RoPE
#   (8192 positions): same tokens, same data, no length; its steps come from the trained run's
#   metrics.jsonl (or STEPS).
# Each is then evaluated as it is by scripts/real_model/real_model_study.py into the shared study (bf16,
# tasks at EVAL_LENGTHS, default 64k,32k,4k; SAMPLES default 50; EVAL_S default 90 s).
set -uo pipefail
out=${1:?OUT_DIR}; which=${2:-both}
mkdir -p "$out"
source scripts/gpu/gpu_study_common.sh
data=${DATA:-data/longtext}
for f in "$data"/*.jsonl.xz; do [ -e "$f" ] && [ ! -e "${f%.xz}" ] && xz -dk "$f"; done
mix="data.sources=[{name: code-repos, path: $data/train.jsonl, weight: 0.63}, {name: short-files, path: $data/short.jsonl, weight: 0.37}]"
train() {  # name, run dir, steps, overrides...
  local name=$1 run=$2 steps=$3; shift 3
  timeout -s TERM -k 60 "${TRAIN_S:-150}" $py -m longctx train --config configs/smollm2-135m-32k.yaml \
    "out_dir=$run" "model.init_from=$model" "data.tokenizer=$model" "$mix" "train.steps=$steps" \
    checkpoint.every=0 log.progress=false "$@" > "$out/train-$name.log" 2>&1
  echo "$name train rc=$? (85: stopped at the budget and saved)"; cp "$run/metrics.jsonl" "$out/metrics-$name.jsonl"
}
evaluate() {  # name, run dir
  $py scripts/real_model/real_model_study.py --model "$model" --trained "$1=$2" --variants "$1" --out "$study" \
    --report "$out/real-model.md" --phases tasks --tasks "${TASKS:-niah_single_1,niah_single_2}" \
    --lengths "${EVAL_LENGTHS:-64k,32k,4k}" --samples "${SAMPLES:-50}" --dtype bf16 --deadline-s "${EVAL_S:-90}" \
    --compare trained:control > "$out/study-$1.log" 2>&1
  echo "$1 study rc=$?"
}
if [ "$which" != control ]; then
  train trained runs/study-64k 1000 data.seq_len=65536 model.max_position_embeddings=65536 \
    "model.rope_parameters={rope_type: yarn, rope_theta: 100000.0, factor: 8.0, original_max_position_embeddings: 8192}" \
    train.grad_accum=2
  evaluate trained runs/study-64k
fi
if [ "$which" != trained ]; then
  steps=${STEPS:-$($py -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['step'])" runs/study-64k/metrics.jsonl)}
  train control runs/study-8k-control "$steps" data.seq_len=8192 model.max_position_embeddings=8192 \
    "model.rope_parameters={rope_type: default, rope_theta: 100000.0}" train.grad_accum=16
  evaluate control runs/study-8k-control
fi
mkdir -p "$out/cells" && cp -r "$study"/. "$out/cells/" 2>/dev/null
sed -n '/^## RULER tasks/,$p' "$out/real-model.md"
