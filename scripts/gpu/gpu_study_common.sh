# Sourced by scripts/gpu/gpu_study_zero_shot.sh and gpu_study_train.sh (not run alone): the carried
# wheels (scripts/gpu/gpu_env.sh), then the model. MODEL (default models/smollm2-135m-instruct) is
# made once per machine from the GGUF, which is carried in two parts (98 MB > one call's 64 MiB):
# models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf.part-aa with the first call, .part-ab with the second
# (scripts/gpu/gpu_study_pack.sh cuts them here); the parts are joined and checked against the
# SHA-256 the pack wrote, then scripts/real_model/smollm2.py --gguf converts. Sets py, model, study.
source scripts/gpu/gpu_env.sh
model=${MODEL:-models/smollm2-135m-instruct}
study=${STUDY:-eval/study-gpu}   # git-ignored: kept on a warm machine between calls, resumed
parts=models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model/config.json" ]; then
  if [ ! -f "$parts.part-aa" ] || [ ! -f "$parts.part-ab" ]; then
    echo "error: MODEL: $model is missing and $parts.part-aa/-ab are not both here (carry one per call)"; exit 2
  fi
  cat "$parts".part-a? > "$parts"
  (cd models/gguf && sha256sum -c SmolLM2-135M-Instruct.Q4_1.gguf.sha256) || exit 2
  $py scripts/real_model/smollm2.py "$model" --gguf "$parts" 2>&1 | tail -2
fi
