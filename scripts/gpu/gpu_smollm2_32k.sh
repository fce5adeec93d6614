#!/usr/bin/env bash
# The 32k recipe (configs/smollm2-135m-32k.yaml) on one CUDA GPU, with its evaluation before and
# after: SmolLM2-135M-Instruct with zero-shot YaRN x4, then continued pretraining at 32k for a
# wall-time budget (SIGTERM at the budget: the trainer finishes its step, saves and exits 85),
# then the trained run. Each evaluation is held-out perplexity at 8k/16k/32k and RULER tasks at 32k.
#
#   bash scripts/gpu/gpu_smollm2_32k.sh OUT_DIR
#
# Needs the model and the text (docs/real_model.md): MODEL (default models/smollm2-135m-instruct;
# made from GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf by scripts/real_model/smollm2.py when missing) and
# DATA (default data/longtext: train.jsonl, short.jsonl, heldout.jsonl; .jsonl.xz files there are
# decompressed first). Wheels in WHEELS (default .whl) are installed to /tmp/site first (a
# machine without network: docs/gpu.md). TRAIN_OVERRIDES: more key=value for longctx train.
# Budgets in seconds: TRAIN_S (default 240), EVAL_S (per evaluation, 120; SIGTERM finishes the
# cell in progress, then 20 s more before SIGKILL).
# RULER_TASKS (default niah_single_1,niah_multikey_1,vt,fwe), RULER_SAMPLES (default 8), LEN (default
# 32768: the RULER length and the longest perplexity window), PPL_LENGTHS (default 8k,16k,LEN),
# GRAD_ACCUM (default 4: 131k tokens per step on one GPU).
set -uo pipefail
out=${1:-gpu_smollm2_out}
mkdir -p "$out"
py=${PYTHON:-python3}
model=${MODEL:-models/smollm2-135m-instruct}
data=${DATA:-data/longtext}
run=${RUN:-runs/smollm2-135m-32k-gpu}
tasks=${RULER_TASKS:-niah_single_1,niah_multikey_1,vt,fwe}
samples=${RULER_SAMPLES:-8}
len=${LEN:-32768}
yarn="model_overrides.rope_parameters={rope_type: yarn, factor: 4.0}"
wheels=${WHEELS:-.whl}
if ls "$wheels"/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
  $py -c "import torch, deepspeed, transformers; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__, 'transformers', transformers.__version__)"
} | tee "$out/machine.txt"

echo "== the model and the text"
if [ ! -f "$model/model.safetensors" ]; then
  [ -n "${GGUF:-}" ] || { echo "error: MODEL: $model has no model.safetensors and GGUF is not set"; exit 2; }
  $py scripts/real_model/smollm2.py "$model" --gguf "$GGUF" 2>&1 | tail -3 | tee "$out/model.txt"
fi
for f in "$data"/*.jsonl.xz; do [ -e "$f" ] && [ ! -e "${f%.xz}" ] && xz -dk "$f"; done
ls -l "$data" | tee "$out/data.txt"

evaluate() {  # name, model dir, extra eval args...
  local name=$1 dir=$2; shift 2
  timeout -k 20 "${EVAL_S:-120}" $py -m longctx eval --model "$dir" --out "$out/$name-ppl" --dtype fp32 --no-progress \
    --suite ppl --ppl-data "$data/heldout.jsonl" --lengths "${PPL_LENGTHS:-8k,16k,$len}" --ppl-windows 2 "$@" > "$out/$name-ppl.log" 2>&1
  echo "$name ppl rc=$?"; tail -4 "$out/$name-ppl.log"
  timeout -k 20 "${EVAL_S:-120}" $py -m longctx eval --model "$dir" --out "$out/$name-ruler" --dtype fp32 --no-progress \
    --tasks "$tasks" --lengths $len --samples "$samples" "$@" > "$out/$name-ruler.log" 2>&1
  echo "$name ruler rc=$?"; tail -4 "$out/$name-ruler.log"
}

echo "== zero-shot YaRN x4 at $len"
evaluate zero-shot "$model" "model_overrides.max_position_embeddings=$len" "$yarn"

echo "== longctx train: the recipe for ${TRAIN_S:-240} s"
$py -m longctx plan --config configs/smollm2-135m-32k.yaml --gpus 1 --gpu-mem 141GB --json \
  "model.init_from=$model" "data.tokenizer=$model" > "$out/plan.json" 2> "$out/plan.log"
timeout -s TERM -k 60 "${TRAIN_S:-240}" $py -m longctx train --config configs/smollm2-135m-32k.yaml \
  "out_dir=$run" "model.init_from=$model" "data.tokenizer=$model" \
  "data.sources=[{name: code-repos, path: $data/train.jsonl, weight: 0.63}, {name: short-files, path: $data/short.jsonl, weight: 0.37}]" \
  "train.grad_accum=${GRAD_ACCUM:-4}" train.steps=1000 checkpoint.every=0 log.progress=false \
  ${TRAIN_OVERRIDES:-} > "$out/train.log" 2>&1
echo "train rc=$? (85: stopped at the budget and saved)"; grep -v WARNING "$out/train.log" | tail -6
cp "$run/metrics.jsonl" "$out/train_metrics.jsonl" 2>/dev/null

echo "== after training"
evaluate trained "$run"
$py - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
for name in ("zero-shot", "trained"):
    for phase in ("ppl", "ruler"):
        p = out / f"{name}-{phase}" / "results.json"
        if not p.is_file():
            print(name, phase, "no results"); continue
        r = json.loads(p.read_text())
        if phase == "ppl":
            print(name, "ppl", {row["length"]: round(row["ppl"], 3) for row in r["ppl"]["rows"]})
        else:
            scores = {}
            for s in r["samples"]:
                scores.setdefault(s["task"], []).append(s["score"])
            print(name, "ruler", {t: round(sum(v) / len(v), 1) for t, v in scores.items()})
rows = [json.loads(line) for line in open(out / "train_metrics.jsonl")] if (out / "train_metrics.jsonl").is_file() else []
if rows:
    print({"steps": len(rows), "loss first/last": (round(rows[0]["loss"], 3), round(rows[-1]["loss"], 3)),
           "tokens/s (last 3)": round(sum(r["tokens_per_s"] for r in rows[-3:]) / len(rows[-3:])),
           "mfu": round(rows[-1]["mfu"], 3), "peak GB": round(max(r["peak_memory_gb"] for r in rows), 2)})
EOF
