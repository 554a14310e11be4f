#!/usr/bin/env bash
# Integration: emulated hosts, `chanter local up --hosts auto --link
# RATE,0` (tools/chanter/hosts.c).  Needs root and `ip netns`; skipped
# (said, with one passing check) without them.
#
# Refusals first: a delay or a loss (no netem in this kernel), a rate tc
# would not read, and a non-root user.  Then a small job (1 data processor,
# 2 embedding servers, 2 trainers) first on a plain local cluster, then on
# 5 emulated hosts with a 200mbit link: every daemon runs in its host's
# network namespace with its unit's ExecStart= command line and listens on
# its host's address, as W/job.ini names it; the links are shaped with tbf
# on both ends; the root namespace has no route, address nor link of the
# emulated hosts and the hosts none to the root's addresses; a data
# processor killed with SIGKILL is restarted in its namespace (and STATUS=
# reaches the supervisor), one stopped with SIGSTOP is killed by the
# watchdog and restarted (sd_notify crosses namespaces); the CLI from the
# root namespace reaches the servers (it joins the ops namespace), and
# `chanter train --workdir W` ends with the digest of the plain cluster,
# bit for bit; `local down` leaves no namespace and no link.  `--hosts 2`
# spreads the daemons over 2 hosts; after a crash (the supervisor and
# every daemon killed) a new `local up` on that W removes the stale
# namespaces first, and so does `local down`.
source "$(dirname "$0")/lib.sh"

need_netns test_hosts

W0=$WORK/plain
W=$WORK/hosts
down_all() { clusters_down "$BIN/chanter" "$W0" "$W"; cleanup; }
trap down_all EXIT

JOB=$WORK/job.ini
job_preamble "$JOB" iterations=20 synthetic.samples=20000
ROOT_NET=$(readlink /proc/self/ns/net)
NS_BEFORE=$(ip netns list | sort)
LINKS_BEFORE=$(ip -o link | awk -F': ' '{print $2}' | sort)

# ---- refusals
C local up --workdir "$WORK/r1" --hosts auto --link 1gbit,10ms >"$WORK/r1.out" 2>&1
[ $? -ne 0 ] && grep -q "netem" "$WORK/r1.out" && [ "$(ip netns list | sort)" = "$NS_BEFORE" ]
expect_rc $? "a delay is refused, naming the missing netem qdisc: $(head -1 "$WORK/r1.out" | cut -c1-120)"
C local up --workdir "$WORK/r2" --hosts auto --link 1gbit,0,1% >"$WORK/r2.out" 2>&1
[ $? -ne 0 ] && grep -q "loss of 1% needs the netem qdisc" "$WORK/r2.out"
expect "a loss is refused the same way"
C local up --workdir "$WORK/r3" --hosts auto --link 1gbits,0 >"$WORK/r3.out" 2>&1
[ $? -ne 0 ] && grep -q "is not one tc reads" "$WORK/r3.out"
expect "a rate tc would not read is refused"
NOBODY=(setpriv --reuid=65534 --regid=65534 --clear-groups)
command -v setpriv >/dev/null || NOBODY=(runuser -u nobody --)
"${NOBODY[@]}" "$BIN/chanter" --set trainers=1 local up --workdir "/tmp/chanter-hosts-nobody-$$" --hosts auto \
  >"$WORK/nobody.out" 2>&1
[ $? -ne 0 ] && grep -q "emulated hosts (--hosts, local.hosts) need root" "$WORK/nobody.out" &&
  [ ! -e "/tmp/chanter-hosts-nobody-$$" ]
expect_rc $? "a non-root user is told that emulated hosts need root: $(head -1 "$WORK/nobody.out" | cut -c1-100)"

# ---- the reference: the same job on a plain local cluster
C local up --workdir "$W0" >"$WORK/up0.out" 2>&1 && "$BIN/chanter" train --workdir "$W0" --quiet >"$WORK/train0.out" 2>&1
expect "the job on a plain local cluster"
D0=$(field "$W0/summary.json" digest 2>/dev/null)
"$BIN/chanter" local down --workdir "$W0" >/dev/null 2>&1

# ---- up on emulated hosts
t0=$(date +%s%N)
C --set local.watchdog_ms=2000 local up --workdir "$W" --hosts auto --link 200mbit,0 >"$WORK/up.out" 2>&1
rc=$?
OPS=$(cat "$W/run/netns-ops" 2>/dev/null)
TAG=${OPS%-ops}
[ $rc -eq 0 ] && [ -n "$TAG" ] && grep -q "^emulated hosts: 5 " "$WORK/up.out" && [ "$(wc -l <"$W/pids")" -eq 6 ] &&
  [ "$(ip netns list | grep -c "^$TAG-")" -eq 7 ]
expect_rc $? "local up --hosts auto: 6 daemons on 5 hosts, 7 namespaces (5 hosts, bridge, ops) in $((($(date +%s%N) - t0) / 1000000)) ms: $(tail -1 "$WORK/up.out" | cut -c1-90)"

# each daemon in its host's namespace, with its unit's command line
bad=""
while read -r name host ns addr; do
  pid=$(pid_of "$W" "$name")
  [ -n "$pid" ] && [ "$(readlink "/proc/$pid/ns/net")" = "$(ip netns exec "$ns" readlink /proc/self/ns/net)" ] &&
    [ "$(readlink "/proc/$pid/ns/net")" != "$ROOT_NET" ] || bad="$bad $name"
done <"$W/run/hosts"
[ -z "$bad" ] && [ "$(readlink "/proc/$(pid_of "$W" trainer-0)/ns/net")" != "$(readlink "/proc/$(pid_of "$W" trainer-1)/ns/net")" ]
expect_rc $? "every daemon runs in its host's network namespace, not the root's (wrong:${bad:- none})"
unit_cmd() { # KIND INDEX: the unit's ExecStart= with the substitutions
  local f=$ROOT/systemd/chanter-$1@.service
  [ "$1" = oracle ] && f=$ROOT/systemd/chanter-oracle.service
  sed -n 's/^ExecStart=//p' "$f" | sed "s#/usr/local/bin/#$(readlink -f "$BIN")/#; s#/etc/chanter/job.ini#$W/job.ini#; s#%i#$2#g"
}
bad=""
for d in dataproc:0 embedding:1 oracle:0 trainer:1; do
  k=${d%:*} i=${d#*:}
  cmd=$(tr '\0' ' ' <"/proc/$(pid_of "$W" "$k-$i")/cmdline")
  case "$cmd" in "$(unit_cmd "$k" "$i") --ready-file "*) ;; *) bad="$bad $k-$i: '$cmd'" ;; esac
done
[ -z "$bad" ]
expect_rc $? "the daemons' command lines are their units' ExecStart= plus --ready-file (wrong:${bad:- none})"
bad=""
for d in oracle-0:7000 dataproc-0:10000 embedding-0:30000 embedding-1:30001; do
  name=${d%:*} port=${d#*:}
  read -r _ _ ns addr < <(grep "^$name " "$W/run/hosts")
  ip netns exec "$ns" ss -ltnH | grep -Fq -e " $addr:$port " -e ":$addr]:$port " || bad="$bad $name"
done
[ -z "$bad" ] && grep -q "^embedding = 10.77.0.2:30000,10.77.0.3:30001$" "$W/job.ini" &&
  grep -q "^trainers = 10.77.0.4,10.77.0.5$" "$W/job.ini" && grep -q "^oracle = 10.77.0.1:7000$" "$W/job.ini"
expect_rc $? "each daemon listens on its host's address, as W/job.ini names it (not:${bad:- none})"
tc -n "$TAG-h2" qdisc show dev eth0 | grep -q "tbf .*rate 200Mbit" &&
  tc -n "$TAG-br" qdisc show dev vh2 | grep -q "tbf .*rate 200Mbit" &&
  tc -n "$TAG-h5" qdisc show dev eth0 | grep -q "tbf .*rate 200Mbit"
expect_rc $? "the links are shaped both ways: $(tc -n "$TAG-h2" qdisc show dev eth0 | head -1)"

# isolation
! ip route show table all | grep -q "10\.77\." && ! ip -o addr | grep -q "10\.77\." &&
  [ "$(ip -o link | awk -F': ' '{print $2}' | sort)" = "$LINKS_BEFORE" ]
expect "the root namespace has no address, route or link of the emulated hosts"
bad=""
ROOT_ADDRS=$(ip -o -4 addr show scope global | awk '{print $4}' | cut -d/ -f1)
for k in 1 2 3 4 5; do
  [ "$(ip -n "$TAG-h$k" -o link | grep -vc ': lo:\|: eth0@')" -eq 0 ] || bad="$bad h$k:links"
  for a in $ROOT_ADDRS 8.8.8.8; do ip -n "$TAG-h$k" route get "$a" >/dev/null 2>&1 && bad="$bad h$k:$a"; done
done
[ -z "$bad" ] && [ "$(ip -n "$TAG-br" -o -4 addr | grep -vc ' lo ')" -eq 0 ]
expect_rc $? "no host has a route to the root's addresses ($(echo $ROOT_ADDRS)) nor out; the bridge has no uplink (wrong:${bad:- none})"

# the supervisor restarts a daemon in its namespace
old=$(pid_of "$W" dataproc-0)
kill -9 "$old"
until_ok 100 eval '[ "$(pid_of "$W" dataproc-0)" != "$old" ] && [ "$(st "$W" dataproc-0 state)" = up ]'
new=$(pid_of "$W" dataproc-0)
[ "$new" != "$old" ] && running "$new" && [ "$(readlink "/proc/$new/ns/net")" = "$(ip netns exec "$TAG-h1" readlink /proc/self/ns/net)" ] &&
  [ -n "$(st "$W" embedding-0 status)" ]
expect_rc $? "a data processor killed with SIGKILL is restarted in its host's namespace (pid $old -> $new); STATUS= reaches the supervisor ('$(st "$W" embedding-0 status)')"

# and the watchdog (sd_notify over W/run/notify, a path socket: it crosses namespaces)
old=$new
kill -STOP "$old"
until_ok 150 eval '[ "$(pid_of "$W" dataproc-0)" != "$old" ] && [ "$(st "$W" dataproc-0 state)" = up ]'
new=$(pid_of "$W" dataproc-0)
[ "$new" != "$old" ] && running "$new" && case "$(st "$W" dataproc-0 last_exit)" in watchdog,*) true ;; *) false ;; esac
expect_rc $? "a stopped data processor is killed by the watchdog and restarted ($(st "$W" dataproc-0 last_exit))"

# the CLI from the root namespace
"$BIN/chanter" embedding stats --config "$W/job.ini" >"$WORK/stats.out" 2>&1
expect "chanter embedding stats --config W/job.ini reaches the servers (through $OPS)"
"$BIN/chanter" train --workdir "$W" --quiet >"$WORK/train.out" 2>&1
D=$(field "$W/summary.json" digest 2>/dev/null)
[ -n "$D0" ] && [ "$D" = "$D0" ]
expect_rc $? "chanter train --workdir W on emulated hosts: the digest of the plain cluster (${D:-none} vs ${D0:-none})"

# ---- down
"$BIN/chanter" local down --workdir "$W" >"$WORK/down.out" 2>&1
[ $? -eq 0 ] && [ "$(ip netns list | sort)" = "$NS_BEFORE" ] &&
  [ "$(ip -o link | awk -F': ' '{print $2}' | sort)" = "$LINKS_BEFORE" ] && [ ! -e "$W/run/netns" ] &&
  [ ! -e "$W/run/netns-ops" ] && grep -q "7 network namespace(s) removed" "$WORK/down.out"
expect_rc $? "local down removes every namespace, veth and bridge: $(cat "$WORK/down.out")"

# ---- after a crash: up again on the same W, kill everything, then down; and a stale up
C local up --workdir "$W" --hosts 2 >"$WORK/up2.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "^emulated hosts: 2 " "$WORK/up2.out" && grep -q "^embedding-1 1 $TAG-h1 10.77.0.1$" "$W/run/hosts" &&
  grep -q "^trainer-0 2 $TAG-h2 10.77.0.2$" "$W/run/hosts"
expect_rc $? "local up --hosts 2 spreads the 5 slots over 2 hosts (embedding-1 on $(awk '$1 == "embedding-1" {print $4}' "$W/run/hosts"))"
kill -9 "$(cat "$W/run/supervisor.pid")" $(awk '{print $2}' "$W/pids") 2>/dev/null
sleep 0.3
C local up --workdir "$W" --hosts 2 >"$WORK/up3.out" 2>&1
[ $? -eq 0 ] && grep -q "removed 4 network namespace(s) left by an earlier cluster" "$WORK/up3.out" &&
  [ "$(ip netns list | grep -c "^$TAG-")" -eq 4 ]
expect_rc $? "local up on a crashed cluster's W removes its stale namespaces first: $(head -1 "$WORK/up3.out" | cut -c1-100)"
kill -9 "$(cat "$W/run/supervisor.pid")" $(awk '{print $2}' "$W/pids") 2>/dev/null
sleep 0.3
"$BIN/chanter" local down --workdir "$W" >"$WORK/down2.out" 2>&1
[ "$(ip netns list | sort)" = "$NS_BEFORE" ] && [ "$(ip -o link | awk -F': ' '{print $2}' | sort)" = "$LINKS_BEFORE" ]
expect_rc $? "after a crash (supervisor and daemons killed) local down still removes them: $(tail -1 "$WORK/down2.out")"

finish
