#!/bin/bash
# What a safe free costs (issue 13, item 2), on a GPU: kernel_churn natively and under the shim for
# each pooling backend and free_sync, the reuse race for every safe mode, and the PyTorch training
# loop without its caching allocator. Runs are interleaved (the H100 host is bimodal per process).
#
#   tools/bench/sync_bench.sh BUILD OUT [BASE_LIB]
#
# BUILD: a build tree (bin/kernel_churn, bin/reuse_race, lib/liballocshim.so). BASE_LIB: another
# liballocshim.so to compare with (the one before a change), run beside the new one. OUT: where the
# logs go; the summary table is printed last. Needs python3 with torch for the PyTorch part
# (skipped otherwise). Results: tools/bench/results/*-sync/results.md.
set -u
B=$(cd "$1" && pwd); O=$2; BASE=${3:-}
mkdir -p "$O"
NEW=$B/lib/liballocshim.so
HERE=$(cd "$(dirname "$0")" && pwd)
TORCH_TRAIN=$HERE/../../tests/gpu/torch_train.py
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$O/gpu.txt" 2>&1

# run LABEL LIB BACKEND FREE_SYNC -- CMD...   (LIB "-": natively)
run() {
  local label=$1 lib=$2 backend=$3 sync=$4; shift 5
  if [ "$lib" = - ]; then
    "$@" > "$O/$label.log" 2>&1
  else
    env ALLOCSHIM_BACKEND="$backend" ALLOCSHIM_CONF="free_sync=$sync" ALLOCSHIM_QUIET=1 \
      ALLOCSHIM_STATS="$O/$label.stats.json" LD_PRELOAD="$lib" "$@" > "$O/$label.log" 2>&1
  fi
  echo "$label rc=$?" >> "$O/rc.txt"
}

# ---- kernel churn: 1-16 threads, 300 iterations each -------------------------------------------
churn_round() {  # ROUND EXTRA-ARGS (--nonblocking or nothing) TAG
  local r=$1 extra=$2 tag=$3
  local K=$B/bin/kernel_churn
  run "churn$tag.native.$r" - - - -- $K $extra
  run "churn$tag.native_async.$r" - - - -- $K --async $extra
  run "churn$tag.vmm_device.$r" "$NEW" vmm device -- $K $extra
  run "churn$tag.vmm_barrier.$r" "$NEW" vmm barrier -- $K $extra
  [ -n "$BASE" ] && run "churn$tag.vmm_barrier_base.$r" "$BASE" vmm barrier -- $K $extra
  run "churn$tag.async_pool_barrier.$r" "$NEW" async_pool barrier -- $K $extra
  [ -n "$BASE" ] && run "churn$tag.async_pool_barrier_base.$r" "$BASE" async_pool barrier -- $K $extra
  run "churn$tag.async_pool_device.$r" "$NEW" async_pool device -- $K $extra
  run "churn$tag.vmm_none.$r" "$NEW" vmm none -- $K $extra
}
for r in 1 2; do
  churn_round $r "" ""
  churn_round $r --nonblocking .nb
done

# ---- the reuse race: 0 corruptions for every safe mode on both pooling backends ----------------
for backend in vmm async_pool; do
  for sync in barrier device none; do
    run "race.$backend.$sync" "$NEW" $backend $sync -- "$B/bin/reuse_race"
    run "race.$backend.$sync.blocking" "$NEW" $backend $sync -- "$B/bin/reuse_race" --blocking-reader
  done
done

# ---- PyTorch without its caching allocator -----------------------------------------------------
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  T="python3 $TORCH_TRAIN --steps 200"
  for r in 1 2 3; do
    run "torch.caching.$r" - - - -- $T
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.default.$r" "$NEW" vmm device -- $T
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier.$r" "$NEW" vmm barrier -- $T
    [ -n "$BASE" ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.vmm_barrier_base.$r" "$BASE" vmm barrier -- $T
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.async_pool_barrier.$r" "$NEW" async_pool barrier -- $T
    [ "$r" = 1 ] && PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "torch.native_nocache.$r" - - - -- $T
  done
else
  echo "torch: skipped (no torch with CUDA)" > "$O/torch.skipped"
fi

# ---- summary ------------------------------------------------------------------------------------
python3 - "$O" <<'EOF'
import glob, json, os, re, sys, hashlib, statistics
o = sys.argv[1]
rc = dict(l.split(" rc=") for l in open(os.path.join(o, "rc.txt")).read().split("\n") if " rc=" in l)
print("GPU:", open(os.path.join(o, "gpu.txt")).read().strip())
bad = [k for k, v in rc.items() if v.strip() not in ("0",) and not (k.startswith("race.") and ".none" in k)]
print("runs failed:", bad or "none")

def churn(tag):
    rows = {}
    for f in sorted(glob.glob(os.path.join(o, f"churn{tag}.*.log"))):
        cfg = os.path.basename(f)[len(f"churn{tag}."):-4].rsplit(".", 1)[0]
        if tag == "" and cfg.startswith("nb."):
            continue
        for l in open(f):
            if l.startswith('{"bench":"kernel_churn"'):
                j = json.loads(l)
                rows.setdefault(cfg, {}).setdefault(j["threads"], []).append(j["us_per_iteration"])
    return rows
for tag, name in (("", "blocking streams"), (".nb", "non-blocking streams")):
    rows = churn(tag)
    if not rows:
        continue
    threads = sorted({t for r in rows.values() for t in r})
    print(f"\nkernel_churn, {name}: us per iteration (each run of the 2 interleaved rounds)")
    print("| config | " + " | ".join(f"{t} thr" for t in threads) + " | 16 thr / vmm_device |")
    print("|---|" + "---|" * (len(threads) + 1))
    dev16 = min(rows.get("vmm_device", {}).get(16, [0]) or [0])
    for cfg, r in rows.items():
        cells = [" / ".join(f"{v:.0f}" for v in r.get(t, [])) for t in threads]
        ratio = f"{min(r[16]) / dev16:.2f}x" if 16 in r and dev16 else "-"
        print(f"| {cfg} | " + " | ".join(cells) + f" | {ratio} |")

print("\nreuse_race (exit 0: no corruption, 3: corrupted)")
for k in sorted(k for k in rc if k.startswith("race.")):
    log = open(os.path.join(o, k + ".log")).read()
    m = re.findall(r"^summary: .*$", log, re.M)
    print(f"| {k} | exit {rc[k].strip()} | {m[-1] if m else (log.strip().splitlines() or [''])[-1]} |")

tr = {}
for f in sorted(glob.glob(os.path.join(o, "torch.*.log"))):
    cfg, rep = os.path.basename(f)[6:-4].rsplit(".", 1)
    text = open(f).read()
    sec = re.findall(r"train_seconds: ([0-9.]+)", text)
    losses = hashlib.sha256("\n".join(l for l in text.splitlines()
                                      if re.match(r"^(step \d+:|parameter checksum:)", l)).encode()).hexdigest()[:12]
    stats = os.path.join(o, f"torch.{cfg}.{rep}.stats.json")
    allocs = "-"
    if os.path.exists(stats):
        j = json.load(open(stats))
        allocs = {b.get("kind"): sum(int(d.get("allocs", 0)) for d in b.get("devices", []))
                  for b in j.get("backends", [])}
    tr.setdefault(cfg, []).append((float(sec[-1]) if sec else None, losses, allocs))
if tr:
    base = min(s for s, _, _ in tr.get("caching", [(None, 0, 0)]) if s) if tr.get("caching") else None
    print("\nPyTorch loop, 190 timed steps: us per step (each run), best ratio to the caching allocator, losses hash")
    for cfg, v in tr.items():
        secs = [s for s, _, _ in v if s]
        us = " / ".join(f"{s / 190 * 1e6:.0f}" for s in secs)
        ratio = f"{min(secs) / base:.3f}x" if base and secs else "-"
        print(f"| {cfg} | {us} | {ratio} | {' '.join(sorted({h for _, h, _ in v}))} | allocs {v[-1][2]} |")
EOF
