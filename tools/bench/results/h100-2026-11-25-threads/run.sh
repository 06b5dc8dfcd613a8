#!/bin/bash
# A/B of the per-thread hot path (issue 13): core_overhead (null driver) and alloc_latency churn
# 1..16 threads natively and under the shim, base (main before) and new, interleaved.
cd "$(dirname "$0")"
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $O/gpu.txt 2>&1
nproc >> $O/gpu.txt
T=1,2,4,8,16
for r in 1 2; do
  for v in base new; do
    ./$v/core_overhead 1000000 > $O/core_$v.$r.txt 2>&1
  done
done
churn() {  # label, build, backend, free_sync
  if [ "$2" = native ]; then
    ./bin/alloc_latency --threads $T --duration-ms 250 > $O/churn_$1.txt 2>&1
  else
    env ALLOCSHIM_BACKEND=$3 ALLOCSHIM_CONF=free_sync=$4 LD_PRELOAD=$PWD/$2/lib/liballocshim.so \
      ./bin/alloc_latency --threads $T --duration-ms 250 > $O/churn_$1.txt 2>&1
  fi
  echo "$1 rc=$?"
}
for r in 1 2; do
  churn native.$r native
  churn vmm_none_base.$r base vmm none
  churn vmm_none_new.$r new vmm none
  churn async_none_base.$r base async_pool none
  churn async_none_new.$r new async_pool none
done
churn vmm_device_base.1 base vmm device
churn vmm_device_new.1 new vmm device
echo "== core_overhead (ns/pair direct, core, added/call)"
for f in $O/core_*.txt; do echo "-- $(basename $f)"; grep -v '^{' $f | tail -5; done
echo "== churn pairs/s by threads"
for f in $O/churn_*.txt; do echo "$(basename $f .txt): $(grep -o '"threads":[0-9]*,"pairs":[0-9]*,"seconds":[0-9.]*,"pairs_per_s":[0-9.]*' $f | sed 's/"threads":\([0-9]*\).*"pairs_per_s":\([0-9.]*\)/\1:\2/' | tr '\n' ' ')"; done
