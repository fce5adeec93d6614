#!/usr/bin/env bash
# Device call: the zero-shot 128k and 64k cells of the real-model study (issue 53) for two
# retrieval tasks, YaRN x16 and dynamic NTK first, then YaRN x8 and the shipped model, bf16, for
# a wall budget; resumes on a warm machine; copies the study's cells and report to OUT.
#   bash scripts/gpu/gpu_study_zero_shot.sh OUT_DIR
# STUDY_S (default 400): the study's budget (its evaluation in flight is stopped cleanly).
# VARIANTS, LENGTHS, TASKS, SAMPLES, DTYPE, EXTRA (more study options; `-- ...` for longctx eval)
# exist so the CPU test runs it on the debug-tiny model.
set -uo pipefail
out=${1:?OUT_DIR}
mkdir -p "$out"
source scripts/gpu/gpu_study_common.sh
gpu_facts > "$out/machine.txt" 2>&1; head -3 "$out/machine.txt"
$py scripts/real_model/real_model_study.py --model "$model" --out "$study" --report "$out/real-model.md" \
  --variants "${VARIANTS:-yarn16,dynamic,yarn8,shipped}" --phases tasks \
  --tasks "${TASKS:-niah_single_1,niah_single_2}" --lengths "${LENGTHS:-128k,64k}" --samples "${SAMPLES:-50}" \
  --dtype "${DTYPE:-bf16}" --deadline-s "${STUDY_S:-400}" ${EXTRA:-} > "$out/study.log" 2>&1
echo "study rc=$? (3: stopped at the budget; rerun to continue)"
mkdir -p "$out/cells" && cp -r "$study"/. "$out/cells/" 2>/dev/null
grep "^\[" "$out/study.log" | tail -12
sed -n '/^## RULER tasks/,$p' "$out/real-model.md"
