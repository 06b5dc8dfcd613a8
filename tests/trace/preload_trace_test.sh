#!/bin/bash
# End to end under the real hook layer: programs run by `allocshim run --trace` against the fake
# libcuda; the traces (one per process with %p, forks included) must report what the programs did.
# Usage: preload_trace_test.sh ALLOCSHIM FAKE_LIBCUDA_DIR PROGRAM_DIR WORKDIR
set -euo pipefail
tool=$1 libdir=$2 progs=$3 work=$4/preload_trace.$$
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$libdir ALLOCSHIM_QUIET=1

"$tool" run --trace "$work/threads.%p.trace" -- "$progs/prog_threads" > "$work/out.txt"
allocs=$(sed -n 's/^alloc=//p' "$work/out.txt")
files=("$work"/threads.*.trace)
[ ${#files[@]} -eq 1 ] || { echo "FAIL: expected one trace, got ${files[*]}"; exit 1; }
[ "$(stat -c %a "${files[0]}")" = 600 ] || { echo "FAIL: trace mode is not 0600"; exit 1; }
"$tool" report --format json --top 1 --sort calls "${files[0]}" > "$work/report.json"
python3 - "$work/report.json" "$allocs" "$progs/prog_threads" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = r["totals"]
assert t["allocs"] == int(sys.argv[2]) == t["frees"], (t, sys.argv[2])
top = r["hot_spots"]["calls"][0]["frames"][0]
assert top["function"] == "worker", top
# File and line come from DWARF: only a build with debug info (Debug, RelWithDebInfo) has them.
debug_info = b".debug_line" in open(sys.argv[3], "rb").read()
if debug_info:
    assert top["file"].endswith("prog_threads.c") and top["line"] > 0, top
else:
    assert "file" not in top, top
print("ok: prog_threads", t["allocs"], "allocations from", top["function"],
      top.get("line", "(no debug info)"))
PY

"$tool" run --trace "$work/fork.%p.trace" -- "$progs/prog_fork" > "$work/out.txt"
forks=$(sed -n 's/^forks=//p' "$work/out.txt")
n=$(ls "$work"/fork.*.trace | wc -l)
[ "$n" -eq $((forks + 1)) ] || { echo "FAIL: $forks forks but $n traces"; exit 1; }
"$tool" report "$work"/fork.*.trace > "$work/report.txt"
grep -q "allocshim report: $n traces" "$work/report.txt" || { cat "$work/report.txt"; exit 1; }
echo "ok: prog_fork, $n traces merged"
