#!/bin/bash
# Issue 13 item 1 end to end: alloc_latency --threads churn (random sizes 256 B..4 MiB log-uniform,
# four live blocks per thread) at 1, 2, 4, 8, 16 threads: natively with cudaMalloc, cudaMallocAsync
# and cuMemAlloc called directly (--driver), and under the shim of two builds, base (main) and new
# (the threads branch), each config run with base and new back to back, the order swapped every
# other round; then the same churn through the new core on the real driver (churn_core: no cudart,
# no wrapper; and --backend-only: the vmm backend alone). Layout beside this script:
# bin/alloc_latency, bin/churn_core, base/lib, new/lib (liballocshim.so and the libraries it
# bundles). ROUNDS= (default 2). Writes OUT/raw.tgz (every log and statistics file) and prints a
# table last.
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}
O=$OUT/raw
mkdir -p "$O"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; lscpu | grep 'Model name'; } > "$O/machine.txt" 2>&1
T=${THREADS:-1,2,4,8,16}
D=${DURATION_MS:-250}
BIN=${BIN:-./bin/alloc_latency}
churn() {  # label, build (native|base|new), backend, free_sync, api flag
  local label=$1 build=$2 backend=$3 sync=$4 flag=$5
  if [ "$build" = native ]; then
    timeout 60 "$BIN" --threads "$T" --duration-ms "$D" $flag > "$O/churn_$label.txt" 2>&1
  else
    timeout 60 env ALLOCSHIM_BACKEND="$backend" ALLOCSHIM_CONF="free_sync=$sync" \
      ALLOCSHIM_STATS="$O/stats_$label.json" LD_PRELOAD="$PWD/$build/lib/liballocshim.so" \
      "$BIN" --threads "$T" --duration-ms "$D" $flag > "$O/churn_$label.txt" 2>&1
  fi
  echo "$label rc=$?"
}
ROUNDS=${ROUNDS:-2}
for r in $(seq 1 "$ROUNDS"); do
  order="base new"
  [ $((r % 2)) = 0 ] && order="new base"
  churn native_malloc.$r native
  churn native_async.$r native - - --async
  churn native_driver.$r native - - --driver
  for b in $order; do churn vmm_none_$b.$r $b vmm none; done
  for b in $order; do churn vmm_none_driver_$b.$r $b vmm none --driver; done
  for b in $order; do churn vmm_device_$b.$r $b vmm device; done
  for b in $order; do churn async_pool_none_$b.$r $b async_pool none; done
done
for r in $(seq 1 "$ROUNDS"); do
  for via in core backend; do
    flag=""
    [ $via = backend ] && flag=--backend-only
    LD_LIBRARY_PATH=$PWD/new/lib/allocshim timeout 60 ./bin/churn_core --threads "$T" --duration-ms "$D" $flag \
      > "$O/core_$via.$r.txt" 2>&1
    echo "churn_core $via.$r rc=$?"
  done
done
cat "$O/machine.txt"
python3 table.py "$O"
tar czf "$OUT/raw.tgz" -C "$OUT" raw && rm -rf "$O"
