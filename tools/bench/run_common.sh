# Sourced by the section scripts of bench.py (migrate_run.sh, launch_run.sh, models_run.sh,
# ahead_run.sh) after they set B (a build with bin/ and lib/) and OUT: the shim, the interpreter,
# the summary every script writes to OUT/table.txt (bench.py's section table), and a command under
# the shim with policy overrides.
mkdir -p "$OUT"
rm -f "$OUT/table.txt"
SHIM="$B/lib/liballocshim.so"
HERE=$(cd "$(dirname "$0")" && pwd)
GPU_TESTS=$HERE/../../tests/gpu  # the GPU suite's programs some sections run too
PY=${PYTHON:-python3}
status=0
note() { echo "$*" | tee -a "$OUT/table.txt"; }
under() {  # under CONF STATS CMD...: CMD with the shim, policy overrides CONF, statistics to STATS
  conf=$1 stats=$2
  shift 2
  LD_PRELOAD="$SHIM" ALLOCSHIM_CONF="$conf" ALLOCSHIM_STATS="$stats" "$@"
}
