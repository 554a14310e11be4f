#!/usr/bin/env bash
# Integration: the systemd units (systemd/) are valid and agree with the
# daemons and with `chanter local`'s supervisor.
#
# `systemd-analyze verify` reads each unit (an instance, @0, for the
# templates) from a copy whose ExecStart= names the binaries of this build
# (the units' /usr/local/bin/chanter-* is not installed here).  verify
# exits 0 after many mistakes it only warns about ("Failed to parse ...,
# ignoring", "Unknown key ..."), so any line it prints fails the test,
# except that user chanter may not exist on this machine.  A broken copy
# of a unit must be reported, so the check can fail.  Then the settings:
# every daemon is Type=notify, NotifyAccess=main, Restart=on-failure, with
# its restart budget in [Unit] (StartLimitBurst = local.restart_burst + 1
# starts within StartLimitIntervalSec = local.restart_window_s) and
# WatchdogSec = local.watchdog_ms = oracle.heartbeat_timeout_ms (their
# defaults, from `chanter config keys`); only the trainer, the one daemon
# that exits 3, has RestartPreventExitStatus=3.
source "$(dirname "$0")/lib.sh"

if ! command -v systemd-analyze >/dev/null; then
  echo "# SKIP: systemd-analyze not found (Debian package systemd: tools/install-deps.sh installs it)"
  nok "systemd-analyze is there to verify the units"
  finish
  exit 1
fi

U=$WORK/units
mkdir -p "$U"
cp "$ROOT"/systemd/*.service "$ROOT"/systemd/*.target "$U/"
sed -i "s#/usr/local/bin/chanter#$BIN/chanter#g" "$U"/*.service
for b in dataproc embedding oracle trainer; do
  [ -x "$BIN/chanter-$b" ] || { nok "build the daemons first: $BIN/chanter-$b is missing"; finish; exit 1; }
done

# verify_clean FILE...: 0 when systemd-analyze verify accepts them without a word (but the allowed ones)
verify_clean() {
  systemd-analyze verify "$@" >"$WORK/verify.out" 2>&1
  local rc=$?
  grep -v -E "[Uu]ser (\"|')?chanter|[Gg]roup (\"|')?chanter|Failed to resolve (user|group) .?chanter" "$WORK/verify.out" |
    grep -v '^$' >"$WORK/verify.bad"
  [ $rc -eq 0 ] && [ ! -s "$WORK/verify.bad" ]
}

units=()
for f in "$U"/*.service "$U"/*.target; do
  n=$(basename "$f")
  case $n in *@.service) n=${n/@./@0.} ;; esac # an instance of a template
  units+=("$U/$n")
  verify_clean "$U/$n"
  expect_rc $? "systemd-analyze verify $n: no error, no warning$([ -s "$WORK/verify.bad" ] && echo ": $(head -2 "$WORK/verify.bad" | tr '\n' ' ')")"
done
verify_clean "${units[@]}"
expect_rc $? "all of them at once (${#units[@]} units)"

# the check can fail: broken copies are reported
cp "$U/chanter-oracle.service" "$U/broken-restart.service"
sed -i 's/^Restart=on-failure/Restart=sometimes/' "$U/broken-restart.service"
! verify_clean "$U/broken-restart.service" && grep -q "sometimes" "$WORK/verify.bad"
expect_rc $? "a unit with Restart=sometimes is reported: $(head -1 "$WORK/verify.bad")"
cp "$U/chanter-oracle.service" "$U/broken-key.service"
sed -i 's/^StartLimitBurst=/StartLimitBrust=/' "$U/broken-key.service"
! verify_clean "$U/broken-key.service" && grep -q "StartLimitBrust" "$WORK/verify.bad"
expect_rc $? "a misspelled key is reported: $(head -1 "$WORK/verify.bad")"
cp "$U/chanter-oracle.service" "$U/broken-exec.service"
sed -i "s#^ExecStart=$BIN/chanter-oracle#ExecStart=$WORK/no-such-binary#" "$U/broken-exec.service"
! verify_clean "$U/broken-exec.service"
expect_rc $? "a unit whose binary is missing is reported: $(head -1 "$WORK/verify.bad")"

# ---- the settings agree with the daemons and the supervisor
def() { "$BIN/chanter" config keys | awk -v k="$1" '$1 == k { sub("default=", "", $3); print $3 }'; }
burst=$(def local.restart_burst); window=$(def local.restart_window_s)
wd=$(def local.watchdog_ms); hb=$(def oracle.heartbeat_timeout_ms)
[ -n "$burst" ] && [ -n "$window" ] && [ -n "$wd" ] && [ "$wd" = "$hb" ]
expect_rc $? "local.watchdog_ms ($wd) = oracle.heartbeat_timeout_ms ($hb) by default"
# get FILE SECTION KEY: the key's value in that section (the last one)
get() { awk -v s="[$2]" -v k="$3" '/^\[/ {in_s = ($0 == s)} in_s && index($0, k "=") == 1 {v = substr($0, length(k) + 2)} END {print v}' "$1"; }
for f in "$ROOT"/systemd/*.service; do
  n=$(basename "$f")
  bad=""
  [ "$(get "$f" Service Type)" = notify ] || bad="$bad Type"
  [ "$(get "$f" Service NotifyAccess)" = main ] || bad="$bad NotifyAccess"
  [ "$(get "$f" Service Restart)" = on-failure ] || bad="$bad Restart"
  [ "$(get "$f" Unit StartLimitBurst)" = $((burst + 1)) ] || bad="$bad StartLimitBurst"
  [ "$(get "$f" Unit StartLimitIntervalSec)" = "$window" ] || bad="$bad StartLimitIntervalSec"
  [ -z "$(get "$f" Service StartLimitBurst)$(get "$f" Service StartLimitIntervalSec)" ] || bad="$bad StartLimit-in-Service"
  [ "$(get "$f" Service WatchdogSec)" = $((wd / 1000)) ] || bad="$bad WatchdogSec"
  [ -n "$(get "$f" Service RestartSec)" ] || bad="$bad RestartSec"
  if [[ $n == chanter-trainer* ]]; then
    [ "$(get "$f" Service RestartPreventExitStatus)" = 3 ] || bad="$bad RestartPreventExitStatus"
  else
    [ -z "$(get "$f" Service RestartPreventExitStatus)" ] || bad="$bad RestartPreventExitStatus"
  fi
  [ -z "$bad" ]
  expect_rc $? "$n: notify, on-failure, StartLimitBurst $((burst + 1)) in ${window} s, WatchdogSec $((wd / 1000))$([[ $n == chanter-trainer* ]] && echo ", RestartPreventExitStatus=3")${bad:+ -- wrong:$bad}"
done
# exit 3 is the trainer's alone (its main.c), which is why only its unit prevents a restart on it
grep -Eq "TRAINER_JOB_FAILED *\? *3 *:" "$ROOT/services/trainer/main.c" && ! grep -qE "rc = 3|return 3|exit\(3\)" "$ROOT"/services/{dataproc,embedding,oracle}/main.c
expect "only the trainer exits 3 (services/*/main.c)"
finish
