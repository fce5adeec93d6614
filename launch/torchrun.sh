#!/bin/bash
# torchrun wrapper for one or many nodes, used directly and by slurm/train.sbatch (one per node).
#
#   one node:    launch/torchrun.sh --nproc-per-node 8 -- train --config configs/x.yaml [key=value ...]
#   many nodes:  on every node (same command, same endpoint and id):
#                launch/torchrun.sh --nnodes 4 --nproc-per-node 8 --rdzv-endpoint node001:29500 \
#                    --rdzv-id myrun -- train --config configs/x.yaml
#                (--rdzv-conf is_host=1 on the endpoint's node when torchrun does not recognise the
#                endpoint as its own address: a second NIC, a network namespace)
#   CPU test:    launch/torchrun.sh --nproc-per-node 2 -- train --config configs/cpu/yarn-llama2-7b-128k.yaml
#
# Everything after `--` is a longctx command line (train / eval / ...). Before a `train` or an
# `eval` it runs launch/preflight.py for the world size it is about to start, so a config or
# option that cannot run (cp larger than the GPUs, unwritable out_dir, a recipe written for a
# bigger cluster, a missing model) fails here with one `error:` line and exit code 2, before
# any rendezvous can hang. Its own bad options fail the same way.
#
# Rendezvous: c10d (torchrun's elastic agent; node ranks are assigned by the store on the
# endpoint host), fixed size, no restarts: a failed worker fails the job, and the SLURM script
# decides about requeueing. The rendezvous waits for the other nodes at most the command's
# start-up limit (parallel.startup_timeout_s: its join_timeout), and an agent that outlives its
# stalled workers (its store calls on a node cut off) is ended (docs/operations.md).
#
# Signals: torchrun's agent forwards SIGTERM/SIGINT to its workers but not SIGUSR1. This script
# forwards SIGUSR1 (SLURM's pre-timeout warning, delivered by srun to every task) to the worker
# processes directly, so the trainer finishes its step, saves a checkpoint, writes
# <out_dir>/PREEMPTED and exits with code 85 (an eval finishes its batch, keeps its cells and
# writes <out>/PREEMPTED); this script then exits 85 too (torchrun itself reports 1). A rank that
# stalls (parallel.timeout_s) ends every worker and leaves <out>/STALLED: this script exits 86. A time
# budget for a run (docs/training.md):
#   timeout --foreground --preserve-status --signal=USR1 90m launch/torchrun.sh ...
set -euo pipefail

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "error: $*" >&2; exit 2; }
value() {  # value OPTION [VALUE ...]: the option needs a value that is not the next option
    if (( $# < 2 )) || [[ -z $2 || $2 == -* ]]; then die "$1: needs a value (launch/torchrun.sh --help)"; fi
}

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=launch/env.sh
source "$HERE/env.sh"

nproc="" nnodes=1 endpoint="" rdzv_id="" rdzv_conf="" log_dir="" preflight=1
while (( $# )); do
    case $1 in
        --nproc-per-node|--nproc_per_node) value "$@"; nproc=$2; shift 2 ;;
        --nnodes) value "$@"; nnodes=$2; shift 2 ;;
        --rdzv-endpoint) value "$@"; endpoint=$2; shift 2 ;;
        --rdzv-id) value "$@"; rdzv_id=$2; shift 2 ;;
        --rdzv-conf) value "$@"; rdzv_conf=$2; shift 2 ;;
        --log-dir) value "$@"; log_dir=$2; shift 2 ;;
        --no-preflight) preflight=0; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; break ;;
        *) die "launch/torchrun.sh: unknown option $1 (longctx arguments go after --)" ;;
    esac
done
longctx_check_env || exit 2
(( $# )) || die "launch/torchrun.sh: no longctx command after -- (e.g. -- train --config configs/x.yaml)"
case $1 in
    train|eval|export|plan|demo) ;;
    *) die "launch/torchrun.sh: unknown longctx command '$1' after --; valid: train, eval, export, plan, demo" ;;
esac
[[ $nnodes =~ ^[1-9][0-9]*$ ]] || die "--nnodes: expected a positive integer, got '$nnodes'"
if [[ -z $nproc ]]; then
    nproc=$(longctx_gpus_per_node)
    nproc=${nproc:-1}
fi
[[ $nproc =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node: expected a positive integer, got '$nproc'"
if [[ -n $endpoint && ! $endpoint =~ ^(\[[0-9a-fA-F:]+\]|[^:[:space:]]+):[0-9]+$ ]]; then
    die "--rdzv-endpoint: expected HOST:PORT (e.g. node001:29500), got '$endpoint'"
fi
if (( nnodes > 1 )) && [[ -z $endpoint ]]; then
    die "--nnodes $nnodes needs --rdzv-endpoint HOST:PORT (the same on every node, HOST = the first node)"
fi
longctx_env_defaults "$nproc"
PY=$LONGCTX_PYTHON
world=$(( nnodes * nproc ))

out_dir=""  # a train's out_dir or an eval's --out (absolute, from the preflight): where a preemption leaves PREEMPTED
startup_s=""  # the command's start-up limit (s): the rendezvous waits no longer for a node that is lost
if (( preflight )) && [[ $1 == train || $1 == eval ]]; then
    checked=$("$PY" "$HERE/preflight.py" --world-size "$world" --command "$1" --startup-limit -- "${@:2}") || exit 2
    out_dir=${checked%$'\n'*}
    startup_s=${checked##*$'\n'}
fi

args=(--nnodes "$nnodes" --nproc-per-node "$nproc" --max-restarts 0)
if (( nnodes > 1 )) || [[ -n $endpoint ]]; then
    args+=(--rdzv-backend c10d --rdzv-endpoint "$endpoint" --rdzv-id "${rdzv_id:-longctx}")
    # a node that never joins (lost during start-up) fails the rendezvous after the start-up
    # limit, not torchrun's own 600 s; a join_timeout of the user's wins
    if [[ -n $startup_s && $rdzv_conf != *join_timeout=* ]]; then
        rdzv_conf=${rdzv_conf:+$rdzv_conf,}join_timeout=$startup_s
    fi
    if [[ -n $rdzv_conf ]]; then args+=(--rdzv-conf "$rdzv_conf"); fi
else
    args+=(--standalone)
fi
if [[ -n $log_dir ]]; then
    # torchrun keeps every rank's stdout/stderr under log_dir (and still prints them)
    mkdir -p "$log_dir" 2>/dev/null || die "--log-dir: cannot create $log_dir"
    args+=(--log-dir "$log_dir" --redirects 3 --tee 3)
else
    # torchrun otherwise leaves an empty torchelastic_* directory in $TMPDIR per run. The name holds
    # this script's pid: one that a SIGKILLed launcher left (its EXIT trap never ran) is removed here
    for stale in "${TMPDIR:-/tmp}"/longctx-torchrun.*; do
        pid=${stale##*/longctx-torchrun.}
        pid=${pid%%.*}
        if [[ -d $stale && $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
            rm -rf "$stale" 2>/dev/null || true
        fi
    done
    log_dir=$(mktemp -d "${TMPDIR:-/tmp}/longctx-torchrun.$$.XXXXXX")
    trap 'rm -rf "$log_dir"' EXIT
    args+=(--log-dir "$log_dir")
fi

echo "[torchrun.sh on $(hostname)] $nnodes node(s) x $nproc processes${endpoint:+, rendezvous $endpoint}" >&2
longctx_print_env >&2
started=$(date +%s)
# the agent is SIGKILLed when this script is (die_with_parent.py), and its workers die with it
# (longctx/runtime/launcher_tie.py): a `kill -9` of this script leaves nothing running
"$PY" "$HERE/die_with_parent.py" "$PY" -m torch.distributed.run "${args[@]}" -m longctx "$@" &
agent=$!

# shellcheck disable=SC2317  # invoked by the traps below
to_workers() {
    # the agent's children are the worker processes
    pkill "-$1" -P "$agent" 2>/dev/null || true
}
trap 'to_workers USR1' USR1
trap 'kill -TERM "$agent" 2>/dev/null || true' TERM
trap 'kill -INT "$agent" 2>/dev/null || true' INT

# A worker that stalled wrote STALLED and exited 86; its agent still makes rendezvous store calls
# (60 s each, one after another) to a store that a cut-off node cannot reach. Once STALLED from
# this run is there and the agent has no worker left, the agent gets AGENT_GRACE_S to end by
# itself, then SIGTERM, then SIGKILL (docs/operations.md, "Every launcher ends").
AGENT_GRACE_S=5
stalled=${out_dir:+$out_dir/STALLED}
stalled_this_run() { [[ -n $stalled && -f $stalled ]] && (( $(stat -c %Y "$stalled" 2>/dev/null || echo 0) >= started )); }
# a worker that has exited but that the agent, blocked in a store call, has not reaped yet is a
# zombie: not left (the agent reaps it only when its call returns, 60 s later or never)
workers_left() { ps -o stat= --ppid "$agent" 2>/dev/null | grep -qv '^Z'; }
idle_since=""  # when the agent was first seen with STALLED and no worker
ended_agent=""
while kill -0 "$agent" 2>/dev/null; do
    sleep 1 &
    wait $! 2>/dev/null || true  # a trapped signal interrupts it; the loop goes on
    if [[ -n $stalled ]] && stalled_this_run && ! workers_left; then
        now=$(date +%s)
        idle_since=${idle_since:-$now}
        waited=$(( now - idle_since ))
        if (( waited >= AGENT_GRACE_S + 5 )); then
            kill -KILL "$agent" 2>/dev/null || true
        elif (( waited >= AGENT_GRACE_S )) && [[ -z $ended_agent ]]; then
            echo "[torchrun.sh] the job stalled and this node's workers have exited; ending torchrun's agent" \
                "(its rendezvous store calls did not end within ${AGENT_GRACE_S} s)" >&2
            ended_agent=1
            kill -TERM "$agent" 2>/dev/null || true
        fi
    fi
done
rc=0
wait "$agent" || rc=$?
# torchrun reports a worker's preemption exit (85) as a failure (1); a PREEMPTED marker this run
# wrote says the trainer saved a checkpoint (the eval its cells) and stopped as asked: exit 85
marker=${out_dir:+$out_dir/PREEMPTED}
if (( rc != 0 )) && [[ -n $marker && -f $marker ]] && (( $(stat -c %Y "$marker") >= started )); then
    if [[ $1 == train ]]; then
        step=$(cat "$marker")
        if [[ $step == 0 ]]; then  # stopped during start-up, before any checkpoint
            echo "[torchrun.sh] preempted before the first step; the same command starts the run" >&2
        else
            echo "[torchrun.sh] preempted: checkpoint saved at step $step; the same command resumes it" >&2
        fi
    else
        echo "[torchrun.sh] preempted: $(cat "$marker") done in $out_dir; the same command continues it" >&2
    fi
    exit 85
fi
# a rank that stalled (longctx/runtime/watchdog.py) wrote STALLED, the line that ended the job, and every
# worker exited: exit 86, which the SLURM scripts requeue as for a lost node
if (( rc != 0 )) && stalled_this_run; then
    echo "[torchrun.sh] $(head -n 1 "$stalled" | sed 's/^error: //'); the same command resumes the run" >&2
    exit 86
fi
exit "$rc"
