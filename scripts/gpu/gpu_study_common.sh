# Sourced by the device calls of the real model (gpu_study_*.sh, gpu_smollm2_32k.sh; not run alone),
# after they set out, budget_s and keep: scripts/gpu/gpu_env.sh (the carried wheels, the budget, the
# summary and the pack at exit), then the model's names and `make_model`, a step's command. MODEL
# (default models/smollm2-135m-instruct) is made once per machine from the GGUF, which is carried in
# two parts (98 MB > one call's 64 MiB): models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf.part-aa with one
# call, .part-ab with the next on the same warm machine (scripts/gpu/gpu_study_pack.sh cuts them
# here); the parts are joined and checked against the SHA-256 the pack wrote, then
# scripts/real_model/smollm2.py --gguf converts. Sets py, model, study, data; `unpack_text` puts
# DATA's *.jsonl.xz (default data/longtext) beside themselves decompressed.
source scripts/gpu/gpu_env.sh
model=${MODEL:-models/smollm2-135m-instruct}
study=${STUDY:-eval/study-gpu}   # git-ignored: kept on a warm machine between calls, resumed
data=${DATA:-data/longtext}
gguf_parts=models/gguf/SmolLM2-135M-Instruct.Q4_1.gguf

make_model() {
  if [ -f "$model/config.json" ]; then echo "$model: made already"; return 0; fi
  if [ ! -f "$gguf_parts.part-aa" ] || [ ! -f "$gguf_parts.part-ab" ]; then
    echo "error: MODEL: $model is missing and $gguf_parts.part-aa/-ab are not both here (carry one per call)"
    return 2
  fi
  cat "$gguf_parts".part-a? > "$gguf_parts"
  (cd models/gguf && sha256sum -c SmolLM2-135M-Instruct.Q4_1.gguf.sha256) || return 2
  $py scripts/real_model/smollm2.py "$model" --gguf "$gguf_parts" 2>&1 | tail -2
}

unpack_text() {
  local f
  for f in "$data"/*.jsonl.xz; do
    [ -e "$f" ] || continue
    [ -e "${f%.xz}" ] || xz -dk "$f" || return 1
  done
  ls -l "$data"
}

# the study's training (issue 53): configs/smollm2-135m-32k.yaml on the ProLong-style mix (code
# repositories 0.63 + short files 0.37) for TRAIN_S at most (SIGTERM at its limit: the trainer
# finishes its step, saves and exits 85), then the run evaluated by real_model_study.py into the
# shared study (bf16, TASKS at EVAL_LENGTHS, SAMPLES, within EVAL_S).
study_train() {  # name, run dir, steps, overrides...
  local name=$1 run=$2 steps=$3; shift 3
  local mix="data.sources=[{name: code-repos, path: $data/train.jsonl, weight: 0.63}, {name: short-files, path: $data/short.jsonl, weight: 0.37}]"
  $py -m longctx train --config configs/smollm2-135m-32k.yaml "out_dir=$run" "model.init_from=$model" \
    "data.tokenizer=$model" "$mix" "train.steps=$steps" checkpoint.every=0 log.progress=false "$@"
  local rc=$?
  cp "$run/metrics.jsonl" "$out/metrics-$name.jsonl" 2>/dev/null
  return $rc
}
study_evaluate() {  # name, run dir
  $py scripts/real_model/real_model_study.py --model "$model" --trained "$1=$2" --variants "$1" --out "$study" \
    --report "$out/real-model.md" --phases tasks --tasks "${TASKS:-niah_single_1,niah_single_2}" \
    --lengths "${EVAL_LENGTHS:-64k,32k,4k}" --samples "${SAMPLES:-50}" --dtype bf16 \
    --deadline-s "$(( ${EVAL_S:-70} - 15 ))" --grace-s 10 --compare trained:control
  local rc=$?
  mkdir -p "$out/cells" && cp -r "$study"/. "$out/cells/"
  return $rc
}
study_summary() { sed -n '/^## RULER tasks/,$p' "$out/real-model.md" 2>/dev/null || echo "no report (see the study logs)"; }
