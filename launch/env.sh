# shellcheck shell=bash
# Environment defaults for longctx jobs, sourced by launch/torchrun.sh and slurm/*.sbatch.
#
# Every value below is a default only: a variable already set in the environment (your
# shell, your site's module, `sbatch --export`) wins. `longctx_print_env` prints what the job
# actually runs with, so nothing here is hidden.
#
#   OMP_NUM_THREADS        CPU threads per process = CPUs of the node / processes per node
#                          (torchrun would otherwise force 1, and unset it oversubscribes).
#   TORCH_NCCL_ASYNC_ERROR_HANDLING=2
#                          a timed-out collective aborts NCCL's communicators and raises in the
#                          rank, which reports the stall (exit 86, STALLED, requeued); 1 and 3
#                          end the process with SIGABRT first (docs/operations.md).
#   TORCH_NCCL_DUMP_ON_TIMEOUT=0
#                          its dump path ends the process with SIGABRT after a timeout, before
#                          longctx reports it.
#   NCCL_DEBUG=WARN        INFO prints the topology/transport NCCL picked: use it when a job is
#                          slow or hangs at start-up.
#   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
#                          fewer "reserved but unallocated" OOMs when sequence lengths or
#                          buffers change between stages.
#   LONGCTX_PYTHON         the interpreter (default: python3 on PATH, e.g. your activated .venv);
#                          checked first: it must find torch and longctx.
#
# Not set here, because they are specific to a cluster's network (set them in your site profile
# or before sbatch; the values show up in the job log):
#   NCCL_SOCKET_IFNAME     interface for bootstrap/socket traffic, e.g. ib0 or ^lo,docker
#   NCCL_IB_HCA            InfiniBand adapters to use, e.g. mlx5_0,mlx5_1
#   NCCL_IB_GID_INDEX      RoCE clusters (often 3)
#   NCCL_NET_GDR_LEVEL     GPUDirect RDMA policy
#   FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1   AWS EFA (with the aws-ofi-nccl plugin)
#   NCCL_P2P_DISABLE / NCCL_IB_DISABLE           only to debug broken links, never for speed

LONGCTX_ENV_VARS=(OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING TORCH_NCCL_DUMP_ON_TIMEOUT NCCL_DEBUG PYTORCH_CUDA_ALLOC_CONF
                  NCCL_SOCKET_IFNAME NCCL_IB_HCA NCCL_IB_GID_INDEX NCCL_NET_GDR_LEVEL FI_PROVIDER
                  CUDA_VISIBLE_DEVICES LONGCTX_PYTHON)

# longctx_env_defaults NPROC_PER_NODE
longctx_env_defaults() {
    local nproc=${1:-1} cpus threads
    cpus=${SLURM_CPUS_ON_NODE:-$(nproc 2>/dev/null || echo 1)}
    threads=$(( cpus / (nproc > 0 ? nproc : 1) ))
    (( threads >= 1 )) || threads=1
    export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads}
    export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-2}
    export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-0}
    export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
    export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
    export LONGCTX_PYTHON=${LONGCTX_PYTHON:-python3}
}

longctx_print_env() {
    local v
    echo "environment:"
    for v in "${LONGCTX_ENV_VARS[@]}"; do
        echo "  $v=${!v-<unset>}"
    done
}

# longctx_gpus_per_node: GPUs (= processes) per node from SLURM's variables, then the
# visible devices; prints nothing when it cannot tell.
longctx_gpus_per_node() {
    local n
    if [[ -n ${LONGCTX_NPROC_PER_NODE:-} ]]; then n=$LONGCTX_NPROC_PER_NODE
    elif [[ -n ${SLURM_GPUS_ON_NODE:-} ]]; then n=$SLURM_GPUS_ON_NODE
    elif [[ -n ${SLURM_GPUS_PER_NODE:-} ]]; then n=${SLURM_GPUS_PER_NODE##*:}   # "8" or "h100:8"
    elif [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then
        local ids
        IFS=, read -r -a ids <<< "$CUDA_VISIBLE_DEVICES"
        n=${#ids[@]}
    elif command -v nvidia-smi >/dev/null 2>&1; then n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    fi
    if [[ ${n:-} =~ ^[0-9]+$ ]] && (( n > 0 )); then echo "$n"; fi
}

# longctx_check_env: one `error:` line (status 2) for a variable a user set to a value the
# launchers cannot use, instead of quietly falling back to a default, and for an interpreter
# (LONGCTX_PYTHON, default python3) that cannot run longctx
longctx_check_env() {
    if [[ -n ${LONGCTX_NPROC_PER_NODE:-} && ! $LONGCTX_NPROC_PER_NODE =~ ^[1-9][0-9]*$ ]]; then
        echo "error: LONGCTX_NPROC_PER_NODE: expected a positive integer (processes per node), got '$LONGCTX_NPROC_PER_NODE'" >&2
        return 2
    fi
    longctx_check_python
}

LONGCTX_CHECKOUT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# longctx_check_python: LONGCTX_PYTHON (default python3) finds torch and longctx -- what every
# worker imports -- without importing them (a fraction of a second). The workers start in the
# current directory too, so a checkout's source tree counts as found, as it does for them.
longctx_check_python() {
    local py=${LONGCTX_PYTHON:-python3} missing venv_hint=""
    if ! command -v "$py" >/dev/null 2>&1; then
        missing="(not found)"
    else
        missing=$("$py" -c 'import importlib.util as u; print(" ".join(m for m in ("torch", "longctx") if u.find_spec(m) is None))' 2>/dev/null) \
            || missing="(does not run)"
    fi
    [[ -z $missing ]] && return 0
    [[ $missing == "("* ]] || missing="(no module named ${missing// /, })"
    if [[ -x $LONGCTX_CHECKOUT/.venv/bin/python ]]; then
        venv_hint=", e.g. LONGCTX_PYTHON=$LONGCTX_CHECKOUT/.venv/bin/python"
    fi
    echo "error: LONGCTX_PYTHON=$py cannot run longctx $missing; activate the virtualenv longctx is installed in or set LONGCTX_PYTHON to its python$venv_hint" >&2
    return 2
}
