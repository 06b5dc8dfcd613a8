#!/bin/bash
# The deployment recipes of docs/deploy.md tried on a clean Debian machine without a GPU: a minimal
# root made by `debootstrap --variant=minbase bookworm ROOTFS` (nothing of CUDA, libdw or libunwind),
# entered with chroot. The fake libcuda (tests/fake/libcuda) stands in for the driver, installed
# where a driver's library goes. Needs root (chroot); changes nothing outside ROOTFS. By hand, not CI.
#   1. Kubernetes, HAMi-core style: only the shim's files (as the DaemonSet copies them) in
#      /opt/allocshim/lib, the ConfigMap's policy in /etc/allocshim; preloaded through LD_PRELOAD
#      with the pod's budget through ALLOCSHIM_CONF, then through /etc/ld.so.preload with a cleared
#      environment, next to programs that never call CUDA.
#   2. The Debian package: apt-get install, --version, doctor, run, report, then the Dockerfile's
#      steps and environment; apt-get purge leaves nothing.
# Usage: clean_machine_trial.sh ROOTFS DEB FAKE_LIBCUDA_DIR PROGRAM_DIR KUBERNETES_YAML
set -uo pipefail
rootfs=$1 deb=$2 fake=$3 progs=$4 manifest=$5
t=/tmp/allocshim-trial
inside() { chroot "$rootfs" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
rows=()
row() { rows+=("$(printf '| %-58s | %-4s | %s |' "$1" "$2" "$3")"); }
check() { local what=$1 detail=$2; shift 2; if "$@"; then row "$what" PASS "$detail"; else row "$what" FAIL "$detail"; fi; }

rm -rf "${rootfs:?}$t" && mkdir -p "$rootfs$t"
mount -t proc proc "$rootfs/proc" && trap 'umount "$rootfs/proc"' EXIT   # the tool reads /proc/self/exe
cp "$deb" "$rootfs$t/allocshim.deb"
cp "$progs/prog_threads" "$rootfs$t/"
cp -L "$fake/libcuda.so.1" "$rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1"
inside ldconfig
before=$(inside find / -xdev -path /proc -prune -o -path $t -prune -o -print | sort)

# 1. Kubernetes: the node's copy of the shim, mounted into a container that does not have the package.
mkdir -p "$rootfs/opt/allocshim/lib" "$rootfs/etc/allocshim"
dpkg-deb -x "$deb" "$rootfs$t/pkg"
cp -a "$rootfs$t/pkg/usr/lib/liballocshim.so" "$rootfs$t/pkg/usr/lib/allocshim" "$rootfs/opt/allocshim/lib/"
python3 - "$manifest" "$rootfs/etc/allocshim" <<'PY'
import sys, yaml
cm = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d["kind"] == "ConfigMap")
for name, text in cm["data"].items():
    open(f"{sys.argv[2]}/{name}", "w").write(text)
PY
inside ALLOCSHIM_POLICY=/etc/allocshim/policy.toml ALLOCSHIM_CONF=budget.device=20GiB \
   ALLOCSHIM_STATS=$t/k8s.json LD_PRELOAD=/opt/allocshim/lib/liballocshim.so $t/prog_threads > "$rootfs$t/k8s.out" 2>&1
rc=$?
limit=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["budget"][0]["limit"] >> 30, s["policy"], sum(d["allocs"] for b in s["backends"] for d in b["devices"]))' "$rootfs$t/k8s.json" 2>&1)
check "k8s: LD_PRELOAD of the mounted shim, ConfigMap policy, budget" "exit $rc; budget GiB, policy, allocations: $limit" \
  test $rc -eq 0 -a "${limit%% *}" = 20
cp "$rootfs/etc/allocshim/ld.so.preload" "$rootfs/etc/ld.so.preload"
inside $t/prog_threads > "$rootfs$t/preload.out" 2>&1
rc=$?
check "k8s: /etc/ld.so.preload, cleared environment" "exit $rc; $(grep -c '^allocshim:' "$rootfs$t/preload.out") exit summary" \
  grep -q '^  vmm (vmm) .* 6400 ' "$rootfs$t/preload.out"
quiet=yes
for cmd in "ls /" "bash -c true" "apt-get --version" "dpkg -l"; do
  inside $cmd > "$rootfs$t/other.out" 2>&1 || quiet="$cmd failed"
  grep -q allocshim "$rootfs$t/other.out" && quiet="$cmd printed allocshim output"
done
check "k8s: ld.so.preload in ls, bash, apt-get, dpkg" "$quiet" test "$quiet" = yes
rm -f "$rootfs/etc/ld.so.preload"
rm -rf "$rootfs/opt/allocshim" "$rootfs/etc/allocshim"

# 2. The package.
inside apt-get install -y --no-install-recommends $t/allocshim.deb > "$rootfs$t/install.out" 2>&1
check "apt-get install ./allocshim.deb (clean bookworm minbase)" "exit $?" test -x "$rootfs/usr/bin/allocshim"
v=$(inside allocshim --version 2>&1)
check "allocshim --version" "$v" grep -q commit <<< "$v"
mv "$rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1" "$rootfs$t/libcuda.so.1" && inside ldconfig
inside allocshim doctor > "$rootfs$t/doctor.out" 2>&1
rc=$?
check "allocshim doctor without a driver: exit 1, saying why" "exit $rc; $(head -1 "$rootfs$t/doctor.out")" test $rc -eq 1
mv "$rootfs$t/libcuda.so.1" "$rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1" && inside ldconfig
inside allocshim doctor > "$rootfs$t/doctor-fake.out" 2>&1
rc=$?
check "allocshim doctor on the fake driver" "exit $rc; $(grep -i -m1 'self-test' "$rootfs$t/doctor-fake.out")" test $rc -le 1
inside allocshim run --stats $t/run.json --trace $t/run.trace -- $t/prog_threads > "$rootfs$t/run.out" 2>&1
rc=$?
n=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(sum(d["allocs"] for b in s["backends"] for d in b["devices"]))' "$rootfs$t/run.json" 2>&1)
check "allocshim run -- prog_threads" "exit $rc, $n allocations served" test $rc -eq 0 -a "$n" = 6400
inside allocshim report --top 1 $t/run.trace > "$rootfs$t/report.out" 2>&1
check "allocshim report (libdw from lib/allocshim)" "exit $?" grep -q worker "$rootfs$t/report.out"
check "man page installed" "/usr/share/man/man1/allocshim.1.gz" test -f "$rootfs/usr/share/man/man1/allocshim.1.gz"
# The Dockerfile's RUN step and ENV, as a container built from it would run them.
inside sh -ec 'mkdir -p /etc/allocshim && allocshim check --print-default > /etc/allocshim/policy.toml && allocshim check /etc/allocshim/policy.toml > /dev/null'
check "Dockerfile: default policy written and checked" "exit $?" test -s "$rootfs/etc/allocshim/policy.toml"
inside ALLOCSHIM_POLICY=/etc/allocshim/policy.toml LD_PRELOAD=/usr/lib/liballocshim.so ALLOCSHIM_CONF=budget.device=20GiB \
   ALLOCSHIM_STATS=$t/docker.json $t/prog_threads > /dev/null 2>&1
rc=$?
check "Dockerfile: ENV preloads the shim with the policy" "exit $rc" test $rc -eq 0 -a -s "$rootfs$t/docker.json"
rm -rf "$rootfs/etc/allocshim"
inside apt-get purge -y allocshim > "$rootfs$t/purge.out" 2>&1
check "apt-get purge allocshim" "exit $?" test ! -e "$rootfs/usr/bin/allocshim"
after=$(inside find / -xdev -path /proc -prune -o -path $t -prune -o -print | sort)
left=$(comm -13 <(echo "$before") <(echo "$after") | grep -v -e '^/var/cache/' -e '^/var/lib/apt/' -e '^/var/log/' \
       -e '^/var/lib/dpkg/' -e '^/etc/ld.so.cache' | tr '\n' ' ')
check "nothing of the package left after purge" "${left:-none}" test -z "$left"

rm -f "$rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1"
inside ldconfig
rm -rf "${rootfs:?}$t"
echo "rootfs: $(cat "$rootfs/etc/debian_version"), package $(basename "$deb")"
printf '| %-58s | %-4s | %s |\n|---|---|---|\n' step result detail
printf '%s\n' "${rows[@]}"
