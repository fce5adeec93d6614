#!/usr/bin/env bash
# Device call: the study's training at 64k (issue 53): YaRN x8, grad_accum 2 (131k tokens per step),
# TRAIN_S seconds (default 85), then evaluated on the same machine (EVAL_S, default 70). Needs the
# model made by the call before (scripts/gpu/gpu_study_model.sh); carries the text
# (data/longtext/train.jsonl.xz, short.jsonl.xz). Weights stay on the machine for
# scripts/gpu/gpu_study_control.sh; cells and report come back (cells/ in rest.tar.gz).
#   bash scripts/gpu/gpu_study_trained.sh OUT_DIR       # BUDGET_S (default below)
set -uo pipefail
out=${1:?OUT_DIR}
budget_s=${BUDGET_S:-250}
keep="real-model.md metrics-trained.jsonl"
summary() { study_summary; }
source scripts/gpu/gpu_study_common.sh

trained() {
  study_train trained runs/study-64k 1000 data.seq_len=65536 model.max_position_embeddings=65536 \
    "model.rope_parameters={rope_type: yarn, rope_theta: 100000.0, factor: 8.0, original_max_position_embeddings: 8192}" \
    train.grad_accum=2
}

step text 20 unpack_text
cuda_step train "${TRAIN_S:-85}" trained
cuda_step evaluate "${EVAL_S:-70}" study_evaluate trained runs/study-64k
