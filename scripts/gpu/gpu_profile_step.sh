#!/usr/bin/env bash
# Where a training step's time goes on one GPU, longctx beside transformers: torch.profiler over one
# step of bench_train.py's model (4 layers of LLaMA-2-7B shape, bf16, full checkpointing) at 8k
# and 32k; each side's top kernels and the time per kind of work (attention, GEMM, loss, RoPE, ...).
#   bash scripts/gpu/gpu_profile_step.sh OUT_DIR       # about 2 minutes on one H100 (timeout 90 s each)
set -uo pipefail
out=${1:-gpu_profile_out}
mkdir -p "$out"
. "$(dirname "$0")/gpu_env.sh"
gpu_facts 2>&1 | tee "$out/machine.txt"
for T in 8192 32768; do
  echo "== T=$T"
  timeout -k 10 90 $py benchmarks/profile_train_step.py --device cuda --preset llama2-7b --layers 4 --seq-len $T \
    --rows 12 --out "$out/profile_$T.json" > "$out/profile_$T.txt" 2>&1
  echo "rc=$?"
done
for T in 8192 32768; do tail -14 "$out/profile_$T.txt"; done
