#!/usr/bin/env bash
# Issue #14 items 1 and 2 on the GPU machine, in one run (results: tests/gpu/results/):
#   1. the suite's reset.* and ipc.* tests (run_gpu_suite.sh with a filter);
#   2. NVIDIA's simpleIPC (cuda-samples, built elsewhere with nvcc -arch sm_90) natively and under
#      every backend;
#   3. programs not written for allocshim that call cudaDeviceReset (RESET_SAMPLES: paths of
#      cuda-samples binaries, built elsewhere), and device_reset at log level info (the shim says
#      what each reset dropped), natively and under every backend: exit status and output
#      compared with the native run;
#   4. the cost of exportable async_pool pools: cudaMalloc+cudaFree pair latency (alloc_latency)
#      with the pools exportable (the default) and with ipc = false, interleaved process by process
#      (the host's medians move between processes). ROUNDS 0 skips it.
#
#   [RESET_SAMPLES="A B"] tests/gpu/reset_ipc_check.sh BUILD SIMPLEIPC [ROUNDS]
# Writes logs to ${OUT:-/tmp}; prints a short table last.
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(cd "$1" && pwd)
simpleipc=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
rounds=${3:-3}
out=${OUT:-/tmp}
mkdir -p "$out"
shim="$build/bin/allocshim"

GPU_SUITE_FILTER="${GPU_SUITE_FILTER:-^(reset|ipc)\.}" OUT="$out" "$here/run_gpu_suite.sh" "$build" >"$out/suite-run.log" 2>&1
suite_rc=$?

declare -A sample
for backend in native vmm async_pool host managed; do
  log="$out/simpleIPC.$backend.log"
  if [ "$backend" = native ]; then
    (cd "$out" && timeout 120 "$simpleipc") >"$log" 2>&1
  else
    (cd "$out" && timeout 120 "$shim" run --backend "$backend" -- "$simpleipc") >"$log" 2>&1
  fi
  sample[$backend]=$?
done

# stdout compared with the native run's (the shim writes only to stderr), timings aside.
declare -A resets
for cmd in "$build/bin/device_reset" "$build/bin/device_reset driver" ${RESET_SAMPLES:-}; do
  read -r -a argv <<<"$cmd"
  name=$(basename "${argv[0]}")${argv[1]:+.${argv[1]}}
  (cd "$out" && timeout 120 "${argv[@]}") >"$out/$name.native.out" 2>&1
  resets[$name.native]=$?
  for backend in vmm async_pool host managed; do
    log="$out/$name.$backend"
    (cd "$out" && timeout 120 "$shim" run --backend "$backend" --conf log.level=info -- "${argv[@]}") \
      >"$log.out" 2>"$log.err"
    rc=$?
    same=same
    diff "$out/$name.native.out" "$log.out" >"$log.diff" || same=differs
    resets[$name.$backend]="$rc $same $(grep -c 'context of device' "$log.err") drops, $(grep -c 'route the shim does not hook' "$log.err") unhooked"
  done
done

bench="$out/pool-ipc-cost.jsonl"
: >"$bench"
for ((i = 0; i < rounds; i++)); do
  for mode in exportable plain; do
    conf=()
    [ "$mode" = plain ] && conf=(--conf backends.async_pool.ipc=false)
    "$shim" run -q --backend async_pool "${conf[@]}" -- "$build/bin/alloc_latency" \
      --sizes 256,1048576,67108864 --budget-ms 300 2>/dev/null |
      grep '"bench":"latency"' | sed "s/^{/{\"mode\":\"$mode\",\"round\":$i,/" >>"$bench"
  done
done

echo
echo "== suite (reset.*, ipc.*) =="
grep -E ' \| (PASS|FAIL|SKIP)|^passed' "$out/gpu-suite.log" || tail -n 30 "$out/suite-run.log"
echo "== simpleIPC (exit status; 0 = passed) =="
for backend in native vmm async_pool host managed; do
  printf '%-12s %s  %s\n' "$backend" "${sample[$backend]}" "$(grep -m1 -iE 'allocshim: ipc|FAIL|error' "$out/simpleIPC.$backend.log")"
done
echo "== programs that call cudaDeviceReset (exit status, output vs native, resets the shim saw) =="
for key in $(printf '%s\n' "${!resets[@]}" | sort); do printf '%-40s %s\n' "$key" "${resets[$key]}"; done
[ "$rounds" -gt 0 ] || exit "$suite_rc"
echo "== async_pool pair median (us), exportable vs ipc=false, per round =="
python3 - "$bench" <<'PY'
import json, sys, statistics, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = collections.defaultdict(list)
for r in rows:
    if "pair_median_ns" in r: by[(r["size"], r["mode"])].append(r["pair_median_ns"] / 1000)
for size in sorted({s for s, _ in by}):
    e, p = by[(size, "exportable")], by[(size, "plain")]
    print(f"{size:>10} B  exportable {[round(x, 3) for x in e]}  plain {[round(x, 3) for x in p]}  "
          f"ratio of medians {statistics.median(e) / statistics.median(p):.3f}" if e and p else f"{size} missing")
PY
exit "$suite_rc"
