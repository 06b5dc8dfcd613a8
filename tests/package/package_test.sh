#!/bin/bash
# The Debian package end to end, without touching the machine: cpack -G DEB from the build tree,
# then the package's files extracted into one scratch root (dpkg -x) and installed and removed with
# dpkg in another (dpkg --root, a private dpkg database).
# Usage: package_test.sh BUILD_DIR CPACK FAKE_LIBCUDA_DIR PROGRAM_DIR
set -euo pipefail
build=$1 cpack=$2 fake=$3 progs=$4
for t in dpkg-deb dpkg-shlibdeps dpkg; do
  command -v $t > /dev/null || { echo "SKIP: $t not installed (dpkg-dev has dpkg-shlibdeps)"; exit 77; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/allocshim_package.XXXXXX")
# cpack's install step writes BUILD/install_manifest.txt: put back what was there before.
manifest=$build/install_manifest.txt
[ -e "$manifest" ] && cp -p "$manifest" "$work/manifest.saved"
cleanup() {
  if [ -e "$work/manifest.saved" ]; then mv -f "$work/manifest.saved" "$manifest"; else rm -f "$manifest"; fi
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$cpack" -G DEB --config "$build/CPackConfig.cmake" -B "$work/out" > "$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack"; }
debs=("$work"/out/allocshim_*.deb)
[ ${#debs[@]} -eq 1 ] && [ -f "${debs[0]}" ] || fail "expected one .deb in $work/out: $(ls "$work/out")"
deb=${debs[0]}
echo "ok: built $(basename "$deb")"

# Control fields: the version carries the commit the tool prints; dependencies found by
# dpkg-shlibdeps name system packages, never the private libraries.
dpkg-deb -f "$deb" Package Version Depends > "$work/control"
cat "$work/control"
commit=$(sed -n 's/.*(commit \([0-9a-f]*\).*/\1/p' "$build/generated/allocshim_version.h")
if [ -n "$commit" ]; then
  grep -q "^Version: .*+g$commit" "$work/control" || fail "package version lacks commit $commit"
fi
grep -q "^Depends: .*libc6" "$work/control" || fail "no libc6 dependency"
grep -Eq "^Depends: .*(libdw|libunwind|libzstd)" "$work/control" && fail "depends on a library it ships"

# Layout: only liballocshim.so directly in lib/; the private copies in lib/allocshim/.
dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's|^\./|/|' > "$work/files"
for f in /usr/bin/allocshim /usr/lib/liballocshim.so /usr/lib/allocshim/libdw.so.1 \
         /usr/lib/allocshim/libunwind.so.8 /usr/lib/allocshim/libzstd.so.1 \
         /usr/share/man/man1/allocshim.1.gz /usr/share/bash-completion/completions/allocshim \
         /usr/share/allocshim/policies/budget-host-spill.toml /usr/share/doc/allocshim/LICENSE \
         /usr/share/doc/allocshim/copyright /usr/share/doc/allocshim/docs/deploy.md; do
  grep -qx "$f" "$work/files" || fail "$f not in the package"
done
stray=$(grep -E '^/usr/lib/[^/]+\.so' "$work/files" | grep -vx /usr/lib/liballocshim.so || true)
[ -z "$stray" ] || fail "libraries that would shadow the system's: $stray"
echo "ok: layout"

# The extracted tree runs: every library of the tool and the shim resolves inside it.
root=$work/x
dpkg-deb -x "$deb" "$root"
tool=$root/usr/bin/allocshim
for obj in "$tool" "$root/usr/lib/liballocshim.so"; do
  LD_TRACE_LOADED_OBJECTS=1 /lib64/ld-linux-x86-64.so.2 "$obj" > "$work/ldd" 2>&1 || { cat "$work/ldd"; fail "ldd $obj"; }
  outside=$(grep -E 'lib(dw|elf|zstd|z|bz2|lzma|unwind)\.so' "$work/ldd" | grep -v "=> $root/usr/" || true)
  [ -z "$outside" ] || fail "$obj loads private libraries from outside the package: $outside"
done
"$tool" --version | tee "$work/version"
[ -z "$commit" ] || grep -q "commit $commit" "$work/version" || fail "--version lacks the commit"
"$tool" check "$root/usr/share/allocshim/policies/budget-host-spill.toml" > /dev/null || fail "check"

# allocshim run: the installed tool preloads the installed shim, which serves the program's
# allocations on the fake libcuda and writes the statistics; a trace is read back by the installed
# report (libdw from the package).
LD_LIBRARY_PATH=$fake ALLOCSHIM_QUIET=1 "$tool" run --stats "$work/stats.json" --trace "$work/t.trace" \
  -- "$progs/prog_threads" > "$work/run.out" || fail "allocshim run exited $?"
allocs=$(sed -n 's/^alloc=//p' "$work/run.out")
python3 - "$work/stats.json" "$allocs" <<'PY' || fail "stats"
import json, sys
s = json.load(open(sys.argv[1]))
served = sum(d["allocs"] for b in s["backends"] for d in b["devices"])
assert served == int(sys.argv[2]) > 0, (served, sys.argv[2])
print("ok: allocshim run served", served, "allocations through the installed shim")
PY
"$tool" report --top 1 "$work/t.trace" > "$work/report.txt" || fail "report"
grep -q worker "$work/report.txt" || { cat "$work/report.txt"; fail "report does not name prog_threads' worker"; }
echo "ok: report"

# doctor without a driver: exit 1, saying why.
set +e
env -u LD_LIBRARY_PATH "$tool" doctor > "$work/doctor" 2>&1
rc=$?
set -e
grep -qi "driver" "$work/doctor" && [ $rc -eq 1 ] || { cat "$work/doctor"; fail "doctor exited $rc"; }
echo "ok: doctor without a driver exits 1"

# Man page and completion.
gzip -t "$root/usr/share/man/man1/allocshim.1.gz"
zcat "$root/usr/share/man/man1/allocshim.1.gz" | grep -q '^\.SS allocshim run' || fail "man page lacks run"
got=$(bash -c 'source "$1"; COMP_WORDS=(allocshim run --po); COMP_CWORD=2; _allocshim; echo "${COMPREPLY[*]}"' \
      _ "$root/usr/share/bash-completion/completions/allocshim")
[ "$got" = "--policy" ] || fail "completion of 'allocshim run --po' gave '$got'"
echo "ok: man page and completion"

# dpkg install and removal in a scratch root: nothing of the package is left behind. The maintainer
# scripts run outside the root (chrootless), so their one command, ldconfig (CPack adds it for a
# library in /usr/lib), is a stub here: it must not rebuild this machine's loader cache.
r=$work/dpkg
mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates" "$work/bin"
touch "$r/var/lib/dpkg/status"
printf '#!/bin/sh\necho "ldconfig $*" >> "%s/ldconfig.log"\n' "$work" > "$work/bin/ldconfig"
chmod +x "$work/bin/ldconfig"
d() { PATH=$work/bin:$PATH dpkg --root="$r" --force-not-root --force-depends --force-script-chrootless \
        --log=/dev/null "$@"; }
d -i "$deb" > "$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -i"; }
[ -x "$r/usr/bin/allocshim" ] || fail "dpkg -i installed no tool"
d -r allocshim >> "$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log"; fail "dpkg -r"; }
left=$(cd "$r" && find . -path ./var/lib/dpkg -prune -o -type f -print)
[ -z "$left" ] || fail "left after dpkg -r: $left"
[ "$(wc -l < "$work/ldconfig.log")" -eq 2 ] || fail "expected ldconfig from postinst and postrm"
echo "ok: dpkg -i and -r in a scratch root"
