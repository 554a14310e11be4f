#!/usr/bin/env bash
# The newcomer's path through the Makefile on a machine without the
# project's packages (issue 11).  The bug this guards against: the Makefile
# reads its libraries from pkg-config when make parses it, so a `make demo`
# that installed the packages as a prerequisite of its own build linked
# with no libraries the first time, and worked only the second time.
#
# "Packages missing" is made without touching the machine: a pkg-config on
# PATH that finds nothing until a marker file exists.  The install step is
# replaced (DEPS_INSTALL) by creating that marker.  Under `make -n` nothing
# is compiled; the lines make would run are printed, and the link lines of
# the build that `make demo` starts must carry the libraries pkg-config
# reports once the packages are there.  A fresh BUILD directory each time.
source "$(dirname "$0")/lib.sh"

FAKE=$WORK/fakebin
mkdir -p "$FAKE"
REAL_PKG=$(command -v pkg-config)
cat >"$FAKE/pkg-config" <<EOF
#!/bin/sh
[ -e "$WORK/installed" ] || exit 1
exec "$REAL_PKG" "\$@"
EOF
chmod +x "$FAKE/pkg-config"
fresh() { PATH="$FAKE:$PATH" make --no-print-directory -C "$ROOT" BUILD="$WORK/build-$1" "${@:2}"; }

# 1. make test (or plain make) before anything is installed: one line, naming what to run
rm -f "$WORK/installed"
fresh t test >"$WORK/test.out" 2>&1; rc=$?
cat "$WORK/test.out" | sed 's/^/# /'
[ "$rc" -ne 0 ] && [ "$(wc -l <"$WORK/test.out")" -eq 1 ] && grep -q "run 'make demo'" "$WORK/test.out" \
  && grep -q "'make deps'" "$WORK/test.out"
expect "make test without the packages stops in one line that says to run make demo or make deps"
fresh a >"$WORK/all.out" 2>&1; rc=$?
[ "$rc" -ne 0 ] && [ "$(wc -l <"$WORK/all.out")" -eq 1 ] && grep -q "make deps" "$WORK/all.out"
expect "plain make without the packages: the same one line"
[ ! -e "$WORK/build-t" ] && [ ! -e "$WORK/build-a" ]
expect "and nothing was compiled"

# 2. make demo: installs, then builds in a make that sees the packages
rm -f "$WORK/installed"
fresh d -n demo DEPS_INSTALL="touch $WORK/installed" >"$WORK/demo.out" 2>&1; rc=$?
[ "$rc" -eq 0 ]
expect_rc $? "make -n demo runs through (install, build, demo)"
[ -e "$WORK/installed" ]
expect "make demo ran the install step first"
libs=$("$REAL_PKG" --libs grpc libprotobuf-c rocksdb)
link=$(grep -E -- "-o $WORK/build-d/bin/chanter-oracle " "$WORK/demo.out" | head -1)
[ -n "$link" ]
expect "the demo's build links chanter-oracle"
missing=""
for l in $libs; do case " $link " in *" $l "*) ;; *) missing="$missing $l";; esac; done
[ -n "$link" ] && [ -z "$missing" ]
expect_rc $? "its link line has the libraries pkg-config gives after the install (missing:${missing:- none})"
grep -q "tools/demo.sh $WORK/build-d" "$WORK/demo.out"
expect "then the demo runs on that build"

# 3. The same check against the old rule proves it can fail: building as a
# prerequisite of the same make links without the libraries.
rm -f "$WORK/installed"
cat >"$WORK/old.mk" <<EOF
include $ROOT/Makefile
olddemo: olddeps all
olddeps:
	+touch $WORK/installed
EOF
PATH="$FAKE:$PATH" make --no-print-directory -C "$ROOT" -f "$WORK/old.mk" BUILD="$WORK/build-o" NO_DEPS_GOALS=olddemo \
  -n olddemo >"$WORK/old.out" 2>&1
oldlink=$(grep -E -- "-o $WORK/build-o/bin/chanter-oracle " "$WORK/old.out" | head -1)
[ -n "$oldlink" ] && ! grep -q -- "-lgrpc" <<<"$oldlink"
expect "control: the old rule (install as a prerequisite) links chanter-oracle without -lgrpc"

finish
