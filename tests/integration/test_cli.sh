#!/usr/bin/env bash
# The CLI's argument handling (issue 11): every command and subcommand
# takes --help, prints its usage once on stdout and exits 0 without
# touching a dataset or a server; an argument error prints one line that
# says what was wrong, then the usage once, and exits 2 (an unknown command
# too); a job key written as an option gets the --set form; a --config that
# is not a job file (a directory, /dev/zero, a FIFO) or has a broken
# section header, a dataset that is a FIFO, and a metrics.listen that is
# not an address are refused at once with one sentence.  No daemon is
# started.
source "$(dirname "$0")/lib.sh"
cd "$WORK"

# help_ok NAME ARGS...: exit 0, exactly one "usage:" line, all on stdout
help_ok() {
  local n=$1; shift
  C "$@" >"$WORK/out" 2>"$WORK/err"; local rc=$?
  local u; u=$(grep -c '^usage:' "$WORK/out")
  [ "$rc" -eq 0 ] && [ "$u" -eq 1 ] && [ ! -s "$WORK/err" ]
  expect_rc $? "$n: exit $rc, $u usage line(s), stderr: $(head -c 120 "$WORK/err")"
}
for cmd in config local train embedding data dataproc bench; do
  help_ok "chanter $cmd --help" $cmd --help
done
help_ok "chanter data stats --help (no dataset is opened)" --set dataset=/nonexistent/file data stats --help
help_ok "chanter data gen -h" data gen -h
help_ok "chanter embedding lookup --help (no server is called)" embedding lookup --help
help_ok "chanter local up --help" local up --help
help_ok "chanter train --local --help" train --local --help
help_ok "chanter dataproc info --help" dataproc info --help
help_ok "chanter help data" help data
help_ok "chanter --help" --help
C bench model --help >"$WORK/out" 2>&1
expect_rc $? "chanter bench model --help: its own options"
grep -q -- "--rows-cap" "$WORK/out"
expect "chanter bench model --help names its options"

# err_is NAME WANT_LINE ARGS...: exit 2, first stderr line exactly WANT_LINE,
# then the usage once, and nothing on stdout
err_is() {
  local n=$1 want=$2; shift 2
  C "$@" >"$WORK/out" 2>"$WORK/err"; local rc=$?
  local first; first=$(head -1 "$WORK/err")
  local u; u=$(grep -c '^usage:' "$WORK/err")
  [ "$rc" -eq 2 ] && [ "$first" = "$want" ] && [ "$u" -eq 1 ] && [ ! -s "$WORK/out" ]
  expect_rc $? "$n (exit $rc, $u usage line(s)): $first"
}
err_is "a job key as an option: the --set hint" \
  "chanter data gen: '--seed' is a job key, not an option: use --set seed=1" data gen --out x --seed 1
[ ! -e "$WORK/x" ]
expect "and nothing was written"
err_is "--key=value and dashes for underscores" \
  "chanter data gen: '--batch-size' is a job key, not an option: use --set batch_size=8" data gen --out x --batch-size=8
err_is "a dotted section key" \
  "chanter dataproc batch: '--embedding.hot-mb' is a job key, not an option: use --set embedding.hot_mb=5" \
  dataproc batch 3 --embedding.hot-mb 5
err_is "a job key before the subcommand's own option" \
  "chanter train: '--iterations' is a job key, not an option: use --set iterations=5" train --local --iterations 5
err_is "an unknown option" "chanter bench e2e: unexpected argument '--quik'" bench e2e --quik
err_is "a missing required option" "chanter data gen: --out FILE is required" data gen
err_is "too few arguments" "chanter dataproc stream: expected FIRST COUNT, got 1 argument" dataproc stream 1
err_is "too many arguments" "chanter data convert: expected [IN] OUT, got 3 arguments" data convert a b c
err_is "an unknown subcommand" "chanter data: unknown subcommand 'frob'" data frob
err_is "local without --workdir" \
  "chanter local up: --workdir DIR is required (the cluster's config, logs and pids live there)" local up
err_is "config keys takes nothing" "chanter config keys: unexpected argument 'extra'" config keys extra
C frob >"$WORK/out" 2>"$WORK/err"; rc=$?
[ "$rc" -eq 2 ] && [ "$(head -1 "$WORK/err")" = "chanter: unknown command 'frob'" ]
expect_rc $? "an unknown command: exit 2 and says which"

# --config that is not a job file: refused at once (timeout: a regression
# that reads /dev/zero for ever or blocks on a FIFO fails, not hangs), with
# one sentence naming the path and what it is
refused() {
  local n=$1 want=$2; shift 2
  timeout 5 "$CHANTER" "$@" >"$WORK/out" 2>"$WORK/err"; local rc=$?
  local first; first=$(head -1 "$WORK/err")
  [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$first" = "$want" ] && [ ! -s "$WORK/out" ]
  expect_rc $? "$n (exit $rc): $first"
}
mkdir -p "$WORK/jobdir"
refused "--config DIR" "chanter: $WORK/jobdir: is a directory, not a job file" --config "$WORK/jobdir" config show
refused "--config /dev/zero" "chanter: /dev/zero: is a character device, not a job file" --config /dev/zero config show
mkfifo "$WORK/job.fifo"
refused "--config FIFO (no writer)" "chanter: $WORK/job.fifo: is a FIFO, not a job file" --config "$WORK/job.fifo" config show
refused "data stats on a FIFO (no writer)" "chanter data stats: $WORK/job.fifo: not a regular file" \
  data stats "$WORK/job.fifo"
refused "a dataset that is a FIFO" "chanter data stats: $WORK/job.fifo: not a regular file" \
  --set dataset="$WORK/job.fifo" data stats
printf 'seed = 1\n[oracle\nwindow = 3\n' >"$WORK/hdr.ini"
refused "a section header without its ]" "chanter: $WORK/hdr.ini:2: missing ] in the section header '[oracle'" \
  --config "$WORK/hdr.ini" config show
refused "metrics.listen that is not an address" \
  "chanter: metrics.listen = 'any' (from --set) is not an IPv4 or IPv6 address (127.0.0.1, 0.0.0.0, ::1, or one of this host's)" \
  --set metrics.listen=any config show

finish
