#!/bin/bash
# What a safe free costs (issue 13, item 2), on a GPU: kernel_churn natively and under the shim for
# each pooling backend and free_sync, the reuse race for every safe mode, and the PyTorch training
# loop without its caching allocator. Runs are interleaved (a host's speed can differ from process to process).
#
#   tools/bench/sync_bench.sh BUILD OUT [BASE_LIB [ALT_LIB]]     (bench.py's sync section)
#
# BUILD: a build tree (bin/kernel_churn, bin/reuse_race, lib/liballocshim.so). BASE_LIB: another
# liballocshim.so to compare with (the one before a change), run beside the new one; ALT_LIB: a
# variant of the change (configurations ending in _alt). OUT: where the
# logs go; the summary table is printed last. Needs python3 with torch for the PyTorch part
# (skipped otherwise). Kept runs: tools/bench/results/README.md.
# Environment: ROUNDS (churn rounds, 2), CHURN_ARGS (more kernel_churn options, e.g. --threads 16),
# CHURN_CONFIGS (which churn configurations, default all), RACE (0: skip the reuse race),
# TORCH_STEPS (200), TORCH_REPS (3: rounds, each running every configuration once), TORCH_CONFIGS
# (default all).
set -u
B=$(cd "$1" && pwd); O=$2; BASE=${3:-}; ALT=${4:-}
mkdir -p "$O"
NEW=$B/lib/liballocshim.so
HERE=$(cd "$(dirname "$0")" && pwd)
TORCH_TRAIN=$HERE/../../tests/gpu/torch_train.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$O/gpu.txt" 2>&1

# run LABEL LIB BACKEND FREE_SYNC -- CMD...   (LIB "-": natively)
run() {
  local label=$1 lib=$2 backend=$3 sync=$4; shift 5
  if [ "$lib" = - ]; then
    "$@" > "$O/$label.log" 2>&1
  else
    env ALLOCSHIM_BACKEND="$backend" ALLOCSHIM_CONF="free_sync=$sync" ALLOCSHIM_QUIET=1 \
      ALLOCSHIM_STATS="$O/$label.stats.json" LD_PRELOAD="$lib" "$@" > "$O/$label.log" 2>&1
  fi
  echo "$label rc=$?" >> "$O/rc.txt"
}

# ---- kernel churn: 1-16 threads, 300 iterations each -------------------------------------------
ROUNDS=${ROUNDS:-2}; CHURN_ARGS=${CHURN_ARGS:-}; RACE=${RACE:-1}
export TORCH_STEPS=${TORCH_STEPS:-200}; TORCH_REPS=${TORCH_REPS:-3}
CHURN_CONFIGS=${CHURN_CONFIGS:-native native_async vmm_device vmm_barrier vmm_barrier_base async_pool_barrier async_pool_barrier_base async_pool_device vmm_none}
TORCH_CONFIGS=${TORCH_CONFIGS:-caching default vmm_barrier vmm_barrier_base async_pool_barrier native_nocache}
want() { case " $1 " in *" $2 "*) return 0;; esac; return 1; }

churn_round() {  # ROUND EXTRA-ARGS (--nonblocking or nothing) TAG
  local r=$1 extra="$2 $CHURN_ARGS" tag=$3 c
  local K=$B/bin/kernel_churn
  for c in $CHURN_CONFIGS; do
    case $c in
      native) run "churn$tag.$c.$r" - - - -- $K $extra ;;
      native_async) run "churn$tag.$c.$r" - - - -- $K --async $extra ;;
      *_base) [ -n "$BASE" ] && run "churn$tag.$c.$r" "$BASE" "${c%_*_base}" "$(echo $c | sed 's/_base$//; s/.*_//')" -- $K $extra ;;
      *_alt) [ -n "$ALT" ] && run "churn$tag.$c.$r" "$ALT" "${c%_*_alt}" "$(echo $c | sed 's/_alt$//; s/.*_//')" -- $K $extra ;;
      *) run "churn$tag.$c.$r" "$NEW" "${c%_*}" "${c##*_}" -- $K $extra ;;
    esac
  done
}
for r in $(seq "$ROUNDS"); do
  churn_round $r "" ""
  churn_round $r --nonblocking .nb
done

# ---- the reuse race: 0 corruptions for every safe mode on both pooling backends ----------------
for backend in vmm async_pool; do
  [ "$RACE" = 0 ] && break
  for sync in barrier device none; do
    run "race.$backend.$sync" "$NEW" $backend $sync -- "$B/bin/reuse_race"
    run "race.$backend.$sync.blocking" "$NEW" $backend $sync -- "$B/bin/reuse_race" --blocking-reader
  done
done

# ---- PyTorch without its caching allocator -----------------------------------------------------
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  T="python3 $TORCH_TRAIN --steps $TORCH_STEPS"
  for r in $(seq "$TORCH_REPS"); do
    want "$TORCH_CONFIGS" caching && run "torch.caching.$r" - - - -- $T
    want "$TORCH_CONFIGS" default && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.default.$r" "$NEW" vmm device -- $T
    want "$TORCH_CONFIGS" vmm_barrier && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier.$r" "$NEW" vmm barrier -- $T
    want "$TORCH_CONFIGS" vmm_barrier_base && [ -n "$BASE" ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier_base.$r" "$BASE" vmm barrier -- $T
    want "$TORCH_CONFIGS" vmm_barrier_alt && [ -n "$ALT" ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier_alt.$r" "$ALT" vmm barrier -- $T
    want "$TORCH_CONFIGS" async_pool_barrier && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.async_pool_barrier.$r" "$NEW" async_pool barrier -- $T
    want "$TORCH_CONFIGS" native_nocache && [ "$r" = 1 ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.native_nocache.$r" - - - -- $T
  done
else
  echo "torch: skipped (no torch with CUDA)" > "$O/torch.skipped"
fi

# ---- summary ------------------------------------------------------------------------------------
python3 "$HERE/sync_summary.py" "$O"
