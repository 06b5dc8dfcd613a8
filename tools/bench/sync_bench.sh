#!/bin/bash
# What a safe free costs (issue 13, item 2), on a GPU: kernel_churn natively and under the shim for
# each pooling backend and free_sync, the reuse race for every safe mode, and the PyTorch training
# loop without its caching allocator. Runs are interleaved (the H100 host is bimodal per process).
#
#   tools/bench/sync_bench.sh BUILD OUT [BASE_LIB]
#
# BUILD: a build tree (bin/kernel_churn, bin/reuse_race, lib/liballocshim.so). BASE_LIB: another
# liballocshim.so to compare with (the one before a change), run beside the new one. OUT: where the
# logs go; the summary table is printed last. Needs python3 with torch for the PyTorch part
# (skipped otherwise). Results: tools/bench/results/*-sync/results.md.
set -u
B=$(cd "$1" && pwd); O=$2; BASE=${3:-}
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
churn_round() {  # ROUND EXTRA-ARGS (--nonblocking or nothing) TAG
  local r=$1 extra=$2 tag=$3
  local K=$B/bin/kernel_churn
  run "churn$tag.native.$r" - - - -- $K $extra
  run "churn$tag.native_async.$r" - - - -- $K --async $extra
  run "churn$tag.vmm_device.$r" "$NEW" vmm device -- $K $extra
  run "churn$tag.vmm_barrier.$r" "$NEW" vmm barrier -- $K $extra
  [ -n "$BASE" ] && run "churn$tag.vmm_barrier_base.$r" "$BASE" vmm barrier -- $K $extra
  run "churn$tag.async_pool_barrier.$r" "$NEW" async_pool barrier -- $K $extra
  [ -n "$BASE" ] && run "churn$tag.async_pool_barrier_base.$r" "$BASE" async_pool barrier -- $K $extra
  run "churn$tag.async_pool_device.$r" "$NEW" async_pool device -- $K $extra
  run "churn$tag.vmm_none.$r" "$NEW" vmm none -- $K $extra
}
for r in 1 2; do
  churn_round $r "" ""
  churn_round $r --nonblocking .nb
done

# ---- the reuse race: 0 corruptions for every safe mode on both pooling backends ----------------
for backend in vmm async_pool; do
  for sync in barrier device none; do
    run "race.$backend.$sync" "$NEW" $backend $sync -- "$B/bin/reuse_race"
    run "race.$backend.$sync.blocking" "$NEW" $backend $sync -- "$B/bin/reuse_race" --blocking-reader
  done
done

# ---- PyTorch without its caching allocator -----------------------------------------------------
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  T="python3 $TORCH_TRAIN --steps 200"
  for r in 1 2 3; do
    run "torch.caching.$r" - - - -- $T
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.default.$r" "$NEW" vmm device -- $T
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier.$r" "$NEW" vmm barrier -- $T
    [ -n "$BASE" ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier_base.$r" "$BASE" vmm barrier -- $T
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.async_pool_barrier.$r" "$NEW" async_pool barrier -- $T
    [ "$r" = 1 ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.native_nocache.$r" - - - -- $T
  done
else
  echo "torch: skipped (no torch with CUDA)" > "$O/torch.skipped"
fi

# ---- summary ------------------------------------------------------------------------------------
python3 "$HERE/sync_summary.py" "$O"
