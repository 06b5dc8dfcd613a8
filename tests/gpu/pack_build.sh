#!/usr/bin/env bash
# Copies what the GPU suite and the GPU benchmark scripts need from a build tree into a small,
# stripped folder that can be taken to a GPU machine without the build's dependencies installed:
#
#   tests/gpu/pack_build.sh [BUILD_DIR] OUT_DIR        (BUILD_DIR default: build)
#
# OUT_DIR gets lib/ (the shim and its bundled libraries), bin/ (every program with device code,
# plus the CLI and the CPU-side GPU test and benchmarks) and COMMIT (the checkout's commit, with
# "-dirty" when the tree has changes). Then, on the GPU machine: tests/gpu/run_gpu_suite.sh OUT_DIR,
# or tools/bench/bench.py OUT_DIR RESULTS.
set -euo pipefail

if [ $# -eq 1 ]; then build=build; out=$1
elif [ $# -eq 2 ]; then build=$1; out=$2
else echo "usage: $0 [BUILD_DIR] OUT_DIR" >&2; exit 2; fi
[ -x "$build/lib/liballocshim.so" ] || [ -f "$build/lib/liballocshim.so" ] || {
  echo "pack_build.sh: $build/lib/liballocshim.so not found: build first" >&2; exit 2; }

# Programs without device code that the GPU suite and the benchmarks (tools/bench/bench.py) run.
cpu_side=(allocshim driver_api conformance_gpu_test launch_overhead core_overhead hit_path churn_core trace_bench
          policy_match_bench policy_load_bench)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp -a "$build/lib/." "$out/lib/"
for f in "$build"/bin/*; do
  name=$(basename "$f")
  keep=0
  for c in "${cpu_side[@]}"; do [ "$name" = "$c" ] && keep=1; done
  # A program with device code carries a fatbinary section (no grep -q: with pipefail, readelf
  # killed by SIGPIPE would read as "no section").
  [ $keep -eq 1 ] || ! readelf -S "$f" 2>/dev/null | grep nv_fatbin >/dev/null || keep=1
  [ $keep -eq 1 ] && cp -a "$f" "$out/bin/"
done
find "$out" -type f \( -name '*.so*' -o -perm -u+x \) -exec strip --strip-unneeded {} + 2>/dev/null || true

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$repo" diff --quiet HEAD 2>/dev/null || commit="$commit-dirty"
echo "$commit" >"$out/COMMIT"
echo "packed $(ls "$out/bin" | wc -l) programs and the shim at $commit into $out ($(du -sh "$out" | cut -f1))"
