#!/usr/bin/env bash
# Device call: SmolLM2-135M-Instruct made on the warm machine from the GGUF's two parts (the first
# carried by the call before, scripts/gpu/gpu_land.sh), for the study's training calls after it.
#   bash scripts/gpu/gpu_study_model.sh OUT_DIR        # BUDGET_S (default below)
set -uo pipefail
out=${1:?OUT_DIR}
budget_s=${BUDGET_S:-145}
keep=""
source scripts/gpu/gpu_study_common.sh

step model 90 make_model
