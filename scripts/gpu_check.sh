#!/usr/bin/env bash
# The checks that need a GPU, as one script (docs/gpu.md has the results and how to read them):
#   1. tests/unit/test_device.py on CUDA (model vs transformers, attention backends, checkpointing,
#      generation, training steps);
#   2. the real trainer (`longctx train`, DeepSpeed engine, NCCL, bf16) for a few steps at 16k;
#   3. benchmarks/bench_train.py on CUDA: longctx vs transformers, tokens/s, memory, MFU.
# Usage (a CUDA machine with torch, transformers, pytest; wheels for missing packages in
# .whl/ are installed to /tmp/site first):   bash scripts/gpu_check.sh OUT_DIR
set -uo pipefail
out=${1:-gpu_check_out}
mkdir -p "$out"
py=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
$py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"

echo "== 1. tests/unit/test_device.py on cuda"
timeout 150 $py -m pytest -q -p no:cacheprovider tests/unit/test_device.py 2>&1 | tail -25 | tee "$out/tests.txt"

echo "== 2. longctx train on cuda (bench-44m, 16k tokens, bf16, full checkpointing, ZeRO-0 and ZeRO-2)"
for stage in 0 2; do
  run=/tmp/gpu_check/train_z$stage; rm -rf "$run"
  timeout 100 $py -m longctx train out_dir="$run" model.preset=bench-44m data.seq_len=16384 \
    data.micro_batch_size=1 train.steps=12 train.dtype=bfloat16 parallel.zero_stage=$stage \
    parallel.activation_checkpointing=full log.progress=false log.tensorboard=false \
    checkpoint.save_hf=false checkpoint.export_hf=true > "$out/train_z$stage.log" 2>&1
  echo "zero $stage rc=$?"; tail -3 "$out/train_z$stage.log"
  cp "$run/metrics.jsonl" "$out/train_z$stage.jsonl"
  $py - "$run" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
last = rows[-4:]
print({"loss first/last": (round(rows[0]["loss"], 3), round(rows[-1]["loss"], 3)),
       "tokens/s": round(sum(r["tokens_per_s"] for r in last) / len(last)),
       "mfu": round(sum(r["mfu"] for r in last) / len(last), 3), "peak GB": round(rows[-1]["peak_memory_gb"], 2),
       "peak source": rows[-1].get("peak_flops_source")})
EOF
done
ls /tmp/gpu_check/train_z0/hf 2>&1 | tr '\n' ' '; echo

echo "== 3. benchmarks/bench_train.py on cuda (llama2-7b shapes, 4 layers)"
timeout 200 $py benchmarks/bench_train.py --device cuda --preset llama2-7b --layers 4 --seq-lens 8192,32768 \
  --hf-max-len 32768 --steps 3 --warmup 1 --out "$out/bench_train.json" 2>&1 | tail -8 | tee "$out/bench_train.txt"
