#!/usr/bin/env bash
# Device call: the study's control (issue 53): as many steps as the trained run made (its
# metrics.jsonl on this warm machine, or STEPS) with the same tokens per step at 8k (grad_accum 16)
# and the shipped RoPE (8192 positions): same tokens, same data, no length. TRAIN_S (default 85),
# then evaluated (EVAL_S, default 70). Runs after scripts/gpu/gpu_study_trained.sh on the same machine.
#   bash scripts/gpu/gpu_study_control.sh OUT_DIR       # BUDGET_S (default below)
set -uo pipefail
out=${1:?OUT_DIR}
budget_s=${BUDGET_S:-220}
keep="real-model.md metrics-control.jsonl"
summary() { study_summary; }
source scripts/gpu/gpu_study_common.sh

control() {
  local steps=${STEPS:-$($py -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['step'])" runs/study-64k/metrics.jsonl)}
  [ -n "$steps" ] || { echo "error: STEPS: not set and runs/study-64k/metrics.jsonl (the trained run) is not here"; return 2; }
  study_train control runs/study-8k-control "$steps" data.seq_len=8192 model.max_position_embeddings=8192 \
    "model.rope_parameters={rope_type: default, rope_theta: 100000.0}" train.grad_accum=16
}

cuda_step train "${TRAIN_S:-85}" control
cuda_step evaluate "${EVAL_S:-70}" study_evaluate control runs/study-8k-control
