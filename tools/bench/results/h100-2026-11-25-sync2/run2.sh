#!/bin/bash
# Run 2 behind results.md, laid out as run.sh: build/ is the change (closes recorded without the
# device lock), base/ main at ead088e (run 1's outcome: kFreesPerEvent 4, closes under the lock),
# alt/ the change with kFreesPerEvent 1 (run2-alt.patch). The logs come back as one archive.
set -u
OUT=${1:?usage: run2.sh OUT}
cat commit.txt > "$OUT/commit.txt" 2>/dev/null
ROUNDS=5 CHURN_ARGS="--threads 16" \
CHURN_CONFIGS="vmm_device vmm_barrier vmm_barrier_base vmm_barrier_alt async_pool_device async_pool_barrier async_pool_barrier_base async_pool_barrier_alt" \
TORCH_STEPS=400 TORCH_REPS=4 TORCH_CONFIGS="caching default vmm_barrier vmm_barrier_base vmm_barrier_alt" \
  bash src/tools/bench/sync_bench.sh build "$OUT/logs" "$PWD/base/lib/liballocshim.so" "$PWD/alt/lib/liballocshim.so" \
  > "$OUT/summary.txt" 2>&1
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
tail -c 9000 "$OUT/summary.txt"
