#!/bin/bash
# The GPU runs behind results.md: run from a directory holding build/ (bin/kernel_churn,
# bin/reuse_race, lib/liballocshim.so of the change), base/lib and alt/lib (the variants: see
# results.md) and src/ (tools/ and tests/ of the commit). OUT: where the logs go.
# Run 1 is this script as it is; run 2 is run2.sh (other PyTorch configurations, logs archived).
set -u
OUT=${1:?usage: run.sh OUT}
cat commit.txt > "$OUT/commit.txt" 2>/dev/null
ROUNDS=5 CHURN_ARGS="--threads 16" \
CHURN_CONFIGS="vmm_device vmm_barrier vmm_barrier_base vmm_barrier_alt async_pool_device async_pool_barrier async_pool_barrier_base async_pool_barrier_alt" \
TORCH_STEPS=400 TORCH_REPS=${TORCH_REPS:-5} TORCH_CONFIGS=${TORCH_CONFIGS:-caching default vmm_barrier} \
  bash src/tools/bench/sync_bench.sh build "$OUT/logs" "$PWD/base/lib/liballocshim.so" "$PWD/alt/lib/liballocshim.so" \
  > "$OUT/summary.txt" 2>&1
# The device machine returns a limited number of files: one archive of the logs.
[ "${TAR_LOGS:-0}" = 1 ] && tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
tail -c 9000 "$OUT/summary.txt"
