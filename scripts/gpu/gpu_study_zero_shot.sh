#!/usr/bin/env bash
# Device call: the zero-shot 128k and 64k cells of the real-model study (issue 53) for two
# retrieval tasks, YaRN x16 and dynamic NTK first, then YaRN x8 and the shipped model, bf16, within
# STUDY_S; resumes on a warm machine. The study's cells come back in rest.tar.gz (under cells/),
# its report as real-model.md.
#   bash scripts/gpu/gpu_study_zero_shot.sh OUT_DIR     # BUDGET_S (default below)
# STUDY_S (default 330): the study's step limit; the study's own deadline is 20 s less, so its
# evaluation in flight is stopped cleanly and the report written. VARIANTS, LENGTHS, TASKS,
# SAMPLES, DTYPE, EXTRA (more study options; `-- ...` for longctx eval) run it on the debug-tiny
# model on CPU.
set -uo pipefail
out=${1:?OUT_DIR}
budget_s=${BUDGET_S:-525}
keep="real-model.md machine.log"
summary() { sed -n '/^## RULER tasks/,$p' "$out/real-model.md" 2>/dev/null || echo "no report (see study.log)"; }
source scripts/gpu/gpu_study_common.sh

zero_shot() {
  $py scripts/real_model/real_model_study.py --model "$model" --out "$study" --report "$out/real-model.md" \
    --variants "${VARIANTS:-yarn16,dynamic,yarn8,shipped}" --phases tasks \
    --tasks "${TASKS:-niah_single_1,niah_single_2}" --lengths "${LENGTHS:-128k,64k}" --samples "${SAMPLES:-50}" \
    --dtype "${DTYPE:-bf16}" --deadline-s "$(( ${STUDY_S:-330} - 20 ))" --grace-s 10 ${EXTRA:-}
  local rc=$?
  echo "study rc=$rc (3: stopped at the budget; rerun to continue)"
  mkdir -p "$out/cells" && cp -r "$study"/. "$out/cells/"
  return $rc
}

step machine 30 gpu_facts
step model 90 make_model
cuda_step study "${STUDY_S:-330}" zero_shot
