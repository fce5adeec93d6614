# Sourced by every device call script in this folder (not run alone). Before sourcing, a script sets
#   out         its output folder (under $OUT on the device: what comes back),
#   budget_s    the seconds it may run in all (default BUDGET_S): it ends by itself within them,
#   keep        the files of $out that come back as they are (at most 5); the rest go into one tar.
# It then
#   1. installs the carried wheels (WHEELS, default .whl; scripts/gpu/gpu_wheels.sh makes them), one
#      folder per set: .whl/SET/*.whl go to SITE/SET (SITE default /tmp/site) with pip, no index;
#      .whl/parts/NAME.parts lists the pieces of a repacked wheel too big for one call, carried by
#      consecutive calls on a warm machine: once every piece is here they are checked, joined and
#      unpacked into SITE/SET. A set already installed (same wheels) is not installed again.
#   2. sets py (PYTHON, default python3), PYTHONPATH (the repository, then each set) and has_cuda
#      (1 where nvidia-smi lists a GPU).
#   3. gives `step NAME LIMIT CMD...` and `cuda_step ...`: CMD under a timeout of LIMIT seconds,
#      cut to what is left of budget_s; a cuda_step without CUDA, and any step once the budget is
#      spent, is recorded as skipped. Each step's line goes to $out/steps.tsv as it ends.
#   4. at exit: the script's `summary` (if it defines one) prints the table from what is on disk,
#      to the screen and $out/summary.md, then $out is packed: the `keep` files, summary.md and
#      steps.tsv stay; everything else goes into $out/rest.tar.gz. At most 8 files, no folders.
# INSTALL_S (below) is what the installs may take; scripts/gpu/gpu_calls.py counts it in every
# call's budget.
set -a              # every variable the script sets from here on reaches its steps (each runs in bash -c)
INSTALL_S=30        # pip of a carried set and the xz unpack of the CuTe DSL libraries (237 MB)
SUMMARY_S=15        # the summary and the pack, after the last step
KILL_S=10           # a step that outlives its limit gets SIGTERM (the trainer saves), SIGKILL this much later
py=${PYTHON:-python3}
gpu_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
wheels=${WHEELS:-.whl}
site=${SITE:-/tmp/site}
budget_s=${budget_s:-${BUDGET_S:?set budget_s before sourcing gpu_env.sh}}
keep=${keep:-}
mkdir -p "$out"
: > "$out/steps.tsv"
export PYTHONUNBUFFERED=1

install_sets() {  # every .whl/SET folder, each into $site/SET once per set of wheels
  local dir set stamp want
  for dir in "$wheels"/*/; do
    set=$(basename "$dir")
    [ "$set" = parts ] && continue
    ls "$dir"*.whl >/dev/null 2>&1 || continue
    stamp="$site/$set/.installed"
    want=$(cd "$dir" && ls *.whl | sort | tr '\n' ' ')
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
      echo "wheels $set: installed already"; continue
    fi
    mkdir -p "$site/$set"
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site/$set" \
      "$dir"*.whl || { echo "error: $dir: its wheels do not install here (see pip above)"; return 1; }
    echo "$want" > "$stamp"
    rm -f "$site/$set"/.joined-*  # pip --upgrade replaced the folders the pieces unpack into: again below
    echo "wheels $set: $(echo $want | wc -w) installed to $site/$set"
  done
}

join_parts() {  # .whl/parts/NAME.parts: "SET", then "sha256  piece" lines, then "sha256  NAME" (the whole)
  local manifest set name missing dir
  for manifest in "$wheels"/parts/*.parts; do
    [ -e "$manifest" ] || continue
    set=$(head -1 "$manifest"); name=$(tail -1 "$manifest" | awk '{print $2}')
    dir="$site/$set"
    if [ -f "$dir/.joined-$name" ]; then echo "$name: unpacked already"; continue; fi
    missing=$(sed '1d;$d' "$manifest" | awk '{print $2}' | while read -r piece; do
      [ -f "$wheels/parts/$piece" ] || echo "$piece"; done)
    if [ -n "$missing" ]; then
      echo "$name: not complete here yet (missing $(echo $missing)); a later call on this warm machine carries it"
      continue
    fi
    sed '1d;$d' "$manifest" | (cd "$wheels/parts" && sha256sum -c --quiet -) \
      || { echo "error: $manifest: a piece does not match its SHA-256"; return 1; }
    mkdir -p "$dir"
    sed '1d;$d' "$manifest" | awk '{print $2}' | (cd "$wheels/parts" && xargs cat) | tar -C "$dir" -xJf - \
      || { echo "error: $name: does not unpack"; return 1; }
    touch "$dir/.joined-$name"
    echo "$name: joined from $(sed '1d;$d' "$manifest" | wc -l) pieces and unpacked into $dir"
  done
}

install_sets && join_parts || exit 1
pypath=$PWD
for dir in "$site"/*/; do
  [ -d "$dir" ] || continue
  pypath=$pypath:${dir%/}
  # the CuTe DSL's own .pth would add this, but only in a real site directory
  [ -d "${dir}nvidia_cutlass_dsl/python_packages" ] && pypath=$pypath:${dir}nvidia_cutlass_dsl/python_packages
  [ -d "${dir}nvidia_cutlass_dsl/dsl_packages" ] && pypath=$pypath:${dir}nvidia_cutlass_dsl/dsl_packages
done
export PYTHONPATH=$pypath${PYTHONPATH:+:$PYTHONPATH}
# a GPU the driver lists (no torch import: seconds); CUDA_VISIBLE_DEVICES="" hides it as it does from torch
has_cuda=0
if [ "${CUDA_VISIBLE_DEVICES-unset}" != "" ] && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then has_cuda=1; fi

left_s() { echo $((budget_s - SUMMARY_S - SECONDS)); }

step() {  # NAME LIMIT CMD...: CMD's output goes to $out/NAME.log; its line to steps.tsv
  local name=$1 limit=$2 lim t0 rc; shift 2
  lim=$(( $(left_s) - KILL_S ))   # what the budget leaves, the kill grace kept back
  if [ "$lim" -lt 5 ] && [ "$lim" -lt "$limit" ]; then
    printf '%s\t%s\t0\tskipped: budget spent\n' "$name" "$limit" >> "$out/steps.tsv"
    echo "== $name: skipped, the call's budget is spent"; return 0
  fi
  [ "$lim" -gt "$limit" ] && lim=$limit
  echo "== $name (limit ${lim} s)"
  t0=$SECONDS
  export out budget_s keep
  export -f $(compgen -A function)  # a step may be one of the script's functions: timeout runs it in bash
  # `trap : TERM`: at the limit the step's shell outlives its command's SIGTERM and runs its last
  # lines (copying what the command wrote); the command itself gets the default disposition
  timeout -k "$KILL_S" "$lim" bash -c 'trap : TERM; "$@"' "$name" "$@" > "$out/$name.log" 2>&1
  rc=$?
  local what="rc $rc"
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && what="rc $rc: stopped at its ${lim} s limit"
  printf '%s\t%s\t%s\t%s\n' "$name" "$lim" "$((SECONDS - t0))" "$what" >> "$out/steps.tsv"
  grep -v WARNING "$out/$name.log" | tail -4
  echo "   $name: $what after $((SECONDS - t0)) s"
}

cuda_step() {  # as step, skipped (and said so) where there is no CUDA device
  if [ "$has_cuda" != 1 ]; then
    printf '%s\t%s\t0\tskipped: no CUDA\n' "$1" "$2" >> "$out/steps.tsv"
    echo "== $1: skipped, no CUDA device"; return 0
  fi
  step "$@"
}

gpu_facts() {  # the GPU, torch, and which attention kernels import here (one line each)
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  $py "$gpu_dir/gpu_facts.py"
}

finish() {
  local rc=$?
  trap - EXIT
  echo "== summary (from the files in $out; ${SECONDS} s of the call's ${budget_s} s budget used)"
  { $py "$gpu_dir/gpu_summary.py" steps "$out"
    if declare -F summary >/dev/null; then summary; fi
  } 2>&1 | tee "$out/summary.md.tmp"
  mv "$out/summary.md.tmp" "$out/summary.md"
  $py "$gpu_dir/gpu_pack.py" "$out" summary.md steps.tsv $keep
  exit $rc
}
trap finish EXIT
