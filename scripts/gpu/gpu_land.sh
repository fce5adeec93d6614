#!/usr/bin/env bash
# Device call: only lands what it carries on the warm machine (a wheel set installed, or a piece of a
# file too big for one call: gpu_env.sh says which); the next call uses it.
#   bash scripts/gpu/gpu_land.sh OUT_DIR              # BUDGET_S (default below)
set -uo pipefail
out=${1:-gpu_land_out}
budget_s=${BUDGET_S:-45}
keep=""
. "$(dirname "$0")/gpu_env.sh"

