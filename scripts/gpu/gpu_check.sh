#!/usr/bin/env bash
# The checks that need a GPU, as one script (docs/gpu.md has the results and how to read them):
#   0. the machine: GPU, torch, triton, and which attention kernels import (flash_attn, flash_attn.cute);
#   1. tests/unit/test_device.py on CUDA (model vs transformers, attention backends, checkpointing,
#      generation, training steps);
#   2. the real trainer (`longctx train`, DeepSpeed engine, NCCL, bf16) for a few steps at 16k;
#   3. benchmarks/bench_train.py on CUDA: longctx vs transformers, tokens/s, memory, MFU, at 8k and
#      32k (interleaved) and 128k (each side alone: transformers may run out of memory there, which
#      is a row of the table, not a stop).
# Each step has its own timeout; all of them together stay under 8 minutes on one H100 (90 + 2 x 50
# + 110 + 2 x 65 s, plus the wheels). The summary table comes last.
# Usage (a CUDA machine with torch, transformers, pytest; wheels for missing packages in
# .whl/ are installed to /tmp/site first, scripts/gpu/gpu_env.sh):   bash scripts/gpu/gpu_check.sh OUT_DIR
set -uo pipefail
out=${1:-gpu_check_out}
mkdir -p "$out"
. "$(dirname "$0")/gpu_env.sh"

echo "== 0. the machine and its attention kernels"
gpu_facts 2>&1 | tee "$out/gpu.txt"

echo "== 1. tests/unit/test_device.py on cuda"
timeout 90 $py -m pytest -q -p no:cacheprovider tests/unit/test_device.py 2>&1 | tail -25 | tee "$out/tests.txt"

echo "== 2. longctx train on cuda (bench-44m, 16k tokens, bf16, full checkpointing, ZeRO-0 and ZeRO-2)"
for stage in 0 2; do
  run=/tmp/gpu_check/train_z$stage; rm -rf "$run"
  timeout 50 $py -m longctx train out_dir="$run" model.preset=bench-44m data.seq_len=16384 \
    data.micro_batch_size=1 train.steps=8 train.dtype=bfloat16 parallel.zero_stage=$stage \
    parallel.activation_checkpointing=full log.progress=false log.tensorboard=false \
    checkpoint.save_hf=false checkpoint.export_hf=true > "$out/train_z$stage.log" 2>&1
  echo "zero $stage rc=$?"; tail -3 "$out/train_z$stage.log"
  cp "$run/metrics.jsonl" "$out/train_z$stage.jsonl" 2>/dev/null
done
ls /tmp/gpu_check/train_z0/hf 2>&1 | tr '\n' ' '; echo

echo "== 3. benchmarks/bench_train.py on cuda (llama2-7b shapes, 4 layers): 8k, 32k, 128k"
bench() {  # name, timeout, bench_train args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" $py benchmarks/bench_train.py --device cuda --preset llama2-7b --layers 4 --steps 3 --warmup 1 \
    --out "$out/bench_train_$name.json" "$@" > "$out/bench_train_$name.txt" 2>&1
  echo "bench_train $name rc=$?"; tail -4 "$out/bench_train_$name.txt"
}
bench 8k_32k 110 --seq-lens 8192,32768 --hf-max-len 32768
bench 128k_ours 65 --seq-lens 131072 --impls ours
bench 128k_hf 65 --seq-lens 131072 --impls hf --hf-max-len 131072

$py "$(dirname "$0")/gpu_summary.py" check "$out"
