#!/usr/bin/env bash
# The whole GPU suite, run on the GPU machine from the repository root with a build tree made
# elsewhere and copied over (tests/gpu/pack_build.sh makes a small stripped copy):
#
#   tests/gpu/run_gpu_suite.sh [BUILD_DIR]        (default: build)
#
# Runs every test in tests/gpu/suite.txt through check_stats.py with paths relative to this
# checkout and BUILD_DIR, so nothing depends on where the tree was configured. Then, when the build
# tree still sits where it was configured, also the other CTest tests labelled gpu (those that are
# not in suite.txt). Writes everything to ${OUT:-/tmp}/gpu-suite.log and prints a table last.
#
# Environment: PYTHON (default python3: the interpreter with PyTorch and CuPy), GPU_SUITE_FILTER
# (an extended regex: run only the suite tests whose name matches).
# Exit status: 0 when nothing failed (SKIPPED is not a failure), 1 otherwise, 2 on a usage error.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
build_arg=${1:-build}
if ! build=$(cd "$build_arg" 2>/dev/null && pwd); then
  echo "run_gpu_suite.sh: build directory '$build_arg' not found (usage: $0 [BUILD_DIR])" >&2
  exit 2
fi
python=${PYTHON:-python3}
filter=${GPU_SUITE_FILTER:-}
out_dir=${OUT:-/tmp}
mkdir -p "$out_dir"
log=$out_dir/gpu-suite.log
: >"$log"

# Everything from here on goes to the terminal and to the log; finish() lets tee drain before the
# script's status is returned, so the table is complete in both.
exec > >(tee -a "$log") 2>&1
tee_pid=$!
finish() {
  exec 1>&- 2>&-
  wait "$tee_pid" 2>/dev/null
  exit "$1"
}
set -f  # suite.txt arguments are split on whitespace below, never globbed

section() { printf '\n===== %s\n' "$*"; }

section "machine"
echo "date:   $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "host:   $(uname -n) ($(uname -sr))"
echo "repo:   $repo ($(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))"
echo "build:  $build"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,compute_mode \
             --format=csv 2>&1
  nvidia-smi 2>&1 | head -n 20
else
  echo "nvidia-smi: not found"
fi
for n in /usr/local/cuda/bin/nvcc nvcc; do
  if command -v "$n" >/dev/null 2>&1; then "$n" --version | tail -n 2; break; fi
done
"$python" - <<'EOF' 2>&1
import sys
print("python:", sys.version.split()[0], sys.executable)
for m in ("torch", "cupy", "jax"):
    try:
        mod = __import__(m)
        print(f"{m}: {getattr(mod, '__version__', '?')}")
    except Exception as e:
        print(f"{m}: not importable ({type(e).__name__}: {e})")
EOF
for f in "$build/bin/allocshim" "$build/lib/liballocshim.so"; do
  [[ -e $f ]] || echo "warning: $f is missing: the suite's tests will fail"
done

names=() results=() details=()
record() { names+=("$1"); results+=("$2"); details+=("$3"); }

# --- the suite (suite.txt)
mapfile -t rows < <(grep -Ev '^[[:space:]]*(#|$)' "$here/suite.txt")
total=${#rows[@]}
i=0
for row in "${rows[@]}"; do
  i=$((i + 1))
  read -r name rest <<<"$row"
  if [[ -n $filter ]] && ! [[ $name =~ $filter ]]; then continue; fi
  section "[$i/$total] $name"
  # shellcheck disable=SC2086  # the arguments are split on whitespace by design (suite.txt)
  set -- $rest
  result_file=$(mktemp)
  "$python" "$here/check_stats.py" --build "$build" --name "$name" "$@" | tee "$result_file"
  rc=${PIPESTATUS[0]}
  line=$(grep -E '^(PASS|FAIL|SKIPPED): ' "$result_file" | tail -n 1)
  rm -f "$result_file"
  detail=${line#*: }     # drop the status
  detail=${detail#*: }   # drop the name
  [[ -n $line ]] || detail="check_stats.py exited $rc without a result line"
  case $rc in
    0) record "$name" PASS "$detail" ;;
    77) record "$name" SKIPPED "$detail" ;;
    *) record "$name" FAIL "$detail" ;;
  esac
done

# --- other CTest tests labelled gpu (not from suite.txt): CTest runs them by the absolute paths
# recorded at configure time, so only when the build tree has not moved.
if [[ -z $filter ]] && command -v ctest >/dev/null 2>&1; then
  configured=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$build/CMakeCache.txt" 2>/dev/null)
  mapfile -t others < <(ctest --test-dir "$build" -N -L gpu -LE gpu-suite 2>/dev/null |
                        sed -n 's/^ *Test *#[0-9]*: //p')
  if ((${#others[@]} > 0)); then
    section "other CTest tests labelled gpu: ${others[*]}"
    if [[ $configured != "$build" ]]; then
      record "ctest -L gpu (${#others[@]} more)" SKIPPED "build tree configured at $configured, now at $build"
    else
      ctest_out=$(mktemp)
      ctest --test-dir "$build" -L gpu -LE gpu-suite --output-on-failure 2>&1 | tee "$ctest_out"
      for t in "${others[@]}"; do
        # e.g. "  3/10 Test  #3: name ......   Passed    0.12 sec" (or ***Failed, ***Skipped, Not Run)
        status=$(grep -E "Test +#[0-9]+: $t " "$ctest_out" | tail -n 1)
        case $status in
          *Passed*) record "ctest:$t" PASS "" ;;
          *Skipped*) record "ctest:$t" SKIPPED "see the log" ;;
          "") record "ctest:$t" FAIL "no result from ctest" ;;
          *) record "ctest:$t" FAIL "$(sed -E 's/.*(\*\*\*|  )//' <<<"$status" | xargs)" ;;
        esac
      done
      rm -f "$ctest_out"
    fi
  fi
fi

# --- the table, last
section "summary (log: $log)"
width=4
for n in "${names[@]}"; do ((${#n} > width)) && width=${#n}; done
printf "%-${width}s | %-7s | %s\n" test result detail
printf '%s\n' "$(printf '%*s' $((width + 30)) '' | tr ' ' '-')"
failed=0 passed=0 skipped=0
for k in "${!names[@]}"; do
  printf "%-${width}s | %-7s | %s\n" "${names[$k]}" "${results[$k]}" "${details[$k]}"
  case ${results[$k]} in
    PASS) passed=$((passed + 1)) ;;
    SKIPPED) skipped=$((skipped + 1)) ;;
    *) failed=$((failed + 1)) ;;
  esac
done
echo "passed $passed, failed $failed, skipped $skipped"
if ((failed == 0)); then finish 0; else finish 1; fi
