#!/usr/bin/env bash
# The IPC latency benchmark (ipc_bench) natively and under the shim with each backend, as one
# Markdown report on stdout (docs/ipc.md keeps the numbers of the last run on the H100):
#
#   tests/gpu/ipc_bench.sh [BUILD_DIR] [ITERATIONS] > ipc_bench.md     (defaults: build, 50)
#
# Runs: the driver's own IPC of cudaMalloc memory (no shim); the shim with the native backend (the
# handles pass through: the shim's overhead on native IPC); vmm; async_pool with ipc = true.
# Exit status: 0, 1 if a run failed, 77 without a GPU.
set -u
build=$(cd "${1:-build}" && pwd) || exit 2
iterations=${2:-50}
bench=$build/bin/ipc_bench
allocshim=$build/bin/allocshim
for f in "$bench" "$allocshim"; do
  [ -x "$f" ] || { echo "ipc_bench.sh: $f not built" >&2; exit 2; }
done

echo "# IPC latency: export + open + close"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), host $(uname -n)"
if command -v nvidia-smi >/dev/null 2>&1; then
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
fi
echo "- commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "- $iterations iterations per size (1 GiB: a fifth); microseconds, median / 90th percentile"
status=0
run() {
  local label=$1
  shift
  echo
  echo "## $label"
  echo
  echo '```'
  "$@" "$bench" "$iterations" >/tmp/ipc_bench.$$ 2>&1
  local rc=$?
  grep -v -e '^allocations:' -e '^frees:' -e '^allocshim: ' /tmp/ipc_bench.$$
  echo '```'
  rm -f /tmp/ipc_bench.$$
  if [ "$rc" = 77 ]; then exit 77; fi
  [ "$rc" = 0 ] || status=1
}
run "native (no shim): the driver's IPC of cudaMalloc memory" env -u LD_PRELOAD
run "allocshim, native backend (driver handles pass through)" "$allocshim" run --quiet --backend native --
run "allocshim, vmm backend" "$allocshim" run --quiet --backend vmm --
run "allocshim, async_pool backend (ipc = true)" "$allocshim" run --quiet --backend async_pool \
  --conf backends.async_pool.ipc=true --
exit $status
