#!/bin/bash
# The quick start as a user types it in a fresh shell, where nvcc is not on PATH: configuring must
# still find the CUDA compiler through the toolkit CMake finds, so the example the README runs
# (alloc_loop) is built; it then runs (exit 77: no GPU here, 0 on a GPU machine).
# Usage: fresh_shell_test.sh SOURCE_DIR
set -euo pipefail
src=$1
work=$(mktemp -d "${TMPDIR:-/tmp}/allocshim_fresh_shell.XXXXXX")
trap 'rm -rf "$work"' EXIT
env -i HOME="$work" PATH=/usr/bin:/bin bash -c '
  set -e
  if command -v nvcc > /dev/null; then echo "nvcc is on PATH=$PATH: nothing to test"; exit 77; fi
  cmake -S "$1" -B "$2/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DALLOCSHIM_BUILD_TESTS=OFF > "$2/configure.log" 2>&1 ||
    { cat "$2/configure.log"; exit 1; }
  grep "CUDA compiler" "$2/configure.log" || true
  cmake --build "$2/b" --target alloc_loop > "$2/build.log" 2>&1 || { tail -20 "$2/build.log"; exit 1; }
' _ "$src" "$work"
set +e
"$work/b/bin/alloc_loop" 2 > "$work/run.log" 2>&1
rc=$?
set -e
[ $rc -eq 0 ] || [ $rc -eq 77 ] || { cat "$work/run.log"; echo "FAIL: alloc_loop exited $rc"; exit 1; }
echo "ok: alloc_loop built without nvcc on PATH, exit $rc"
