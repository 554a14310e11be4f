#!/usr/bin/env bash
# Integration: failover (DESIGN.md section 5), through `chanter drill` on a
# real local cluster (a data processor, two RocksDB embedding servers, the
# oracle, two trainers over loopback gRPC and Gloo, lookahead auto) under
# `chanter local`'s supervisor, which restarts what dies.
#
# The guarantee: each job below completes with the digest BIT-identical to
# the job that never failed (the reference, run by the first drill):
#   - kill -9 of a trainer at a random iteration: the oracle notices, the
#     supervisor restarts it, the job replays from its checkpoint; trainer
#     0 is the same process throughout (it leaves the broken generation and
#     joins the next);
#   - kill -9 of the oracle: the restarted oracle recovers the job
#     (oracle.state_dir); both trainers are the same processes throughout
#     (they retry Join until it is back);
#   - kill -9 of an embedding server: without durable writes the job rolls
#     back; with them (sync_writes) it records no recovery, the clients'
#     retries carry over the outage, the trainers the same processes;
#   - kill -9 of the data processor;
#   - a trainer stopped with SIGSTOP: taken for hung by the oracle (its
#     heartbeat timeout), killed by the supervisor's watchdog; an embedding
#     server stopped the same way (with durable writes): the watchdog kills
#     it and it is restarted;
#   - a second kill while the job replays after the first: two recoveries.
# SIGTERM of the oracle mid-job stops the job: both trainers exit 0 at
# once, nothing is restarted, and chanter train says the job stopped.  With
# oracle.max_recoveries = 1, two kills fail the job, saying it gave up.
# (Acknowledged writes surviving an embedding server's kill -9 row by row:
# test_embedding_restart.sh.)
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
# failover with rows cached, replicated and in delayed sync at the kill (auto would
# partition the tables: test_strategy.sh kills a trainer and the oracle under it)
job_preamble "$JOB" table_strategy=cache iterations=240 eval_every=60 cache_rows=200000 checkpoint_every=40 \
  checkpoint_seconds=0 oracle.heartbeat_timeout_ms=2000 local.watchdog_ms=2000
at() { echo $((RANDOM % 140 + 40)); } # a random iteration of the job, past its first checkpoint or not
# NAME never restarted by the drill's supervisor and ended by its exit 0 at the end: the same process throughout
survived() {
  ! grep -q "\"event\": *\"restart\", \"name\": *\"$2\"" "$WORK/$1/drill/run/events" &&
    grep -q "\"event\": *\"exit\", \"name\": *\"$2\".*\"how\": *\"exit 0\"" "$WORK/$1/drill/run/events"
}
drill() { # dir kind [args]: the drill's JSON in dir.json, its stderr in dir.err; rc of the drill
  local d=$1; shift
  C "$@" --workdir "$WORK/$d" --json >"$WORK/$d.json" 2>"$WORK/$d.err"
}
show() { # the drill's verdict, for the log
  jf "$WORK/$1.json" "'%s %s: %s' % (d['kind'], 'PASS' if d['pass'] else 'FAIL', ', '.join('%s at %d, recovery %s, first replayed +%.2f s' % (k['who'], k['at_iteration'], k['recovery'] or '-', k['first_replayed_s']) for k in d['kills']))" | sed 's/^/# /'
  [ -s "$WORK/$1.err" ] && grep -E "error|FAIL" "$WORK/$1.err" | head -3 | sed 's/^/#   /'
  return 0
}

# ---- a trainer: the reference (run by this first drill) and the kill
A=$(at)
drill trainer drill kill-trainer --rank 1 --at "$A"; rc=$?
show trainer
REF=$(jf "$WORK/trainer.json" "d['reference']")
expect_rc $rc "kill -9 of trainer 1 at iteration $A: the job completes with the reference digest (${REF:0:16}...)"
[ "$(jf "$WORK/trainer.json" "d['kills'][0]['recovery']")" = trainer ] &&
  [ "$(jf "$WORK/trainer.json" "d['kills'][0]['restarted_s'] >= 0 and d['kills'][0]['first_replayed_s'] >= 0")" = True ]
expect "  the oracle noticed the lost trainer, the supervisor restarted it, the job replayed from its checkpoint"
survived trainer trainer-0; expect "  trainer 0 is the same process from start to end (it rolled back in place)"
[ "$(grep -c ' started rank=0 ' "$WORK/trainer/drill/logs/trainer-0.log")" = 1 ] &&
  grep -q "leaving this generation" "$WORK/trainer/drill/logs/trainer-0.log"
expect "  trainer 0 left the broken generation and joined the next one without restarting"

# ---- the oracle
A=$(at)
drill oracle drill kill-oracle --at "$A" --reference "$REF"; rc=$?
show oracle
expect_rc $rc "kill -9 of the oracle at iteration $A: the restarted oracle recovers the job (oracle.state_dir), same digest"
[ "$(jf "$WORK/oracle.json" "d['kills'][0]['recovery']")" = oracle ]; expect "  its recovery is listed as the oracle's"
survived oracle trainer-0 && survived oracle trainer-1
expect "  both trainers are the same processes from start to end (they retried Join until the oracle was back)"

# ---- an embedding server: without durable writes the job rolls back; with them it goes on
# (early enough that the oracle's once-a-second probe sees the restart before the job's end)
A=$((RANDOM % 60 + 40))
drill emb drill kill-embedding --rank 0 --at "$A" --reference "$REF"; rc=$?
show emb
expect_rc $rc "kill -9 of embedding server 0 at iteration $A (sync_writes = false): same digest"
[ "$(jf "$WORK/emb.json" "d['kills'][0]['recovery']")" = embedding ]
expect "  the oracle's probe saw it restarted without durable writes and rolled the job back"
A=$((RANDOM % 60 + 40)) # early, as above: the probe must see the restart for its "no rollback" line
drill emb_sync --set embedding.sync_writes=true drill kill-embedding --rank 1 --at "$A" --reference "$REF"; rc=$?
show emb_sync
expect_rc $rc "kill -9 of embedding server 1 at iteration $A (sync_writes = true): same digest"
[ "$(jf "$WORK/emb_sync.json" "d['recoveries']")" = 0 ] && grep -q "no rollback" "$WORK/emb_sync/drill/logs/oracle-0.log"
expect "  no rollback: its write-ahead log kept every acknowledged write, the clients' retries carried over the outage"
survived emb_sync trainer-0 && survived emb_sync trainer-1; expect "  the trainers are the same processes"

# ---- a data processor
A=$(at)
drill dp drill kill-dataproc --at "$A" --reference "$REF"; rc=$?
show dp
expect_rc $rc "kill -9 of the data processor at iteration $A: same digest, no rollback"

# ---- a hung trainer (SIGSTOP): the heartbeat timeout (2 s) notices, the watchdog (5 s here) kills it
A=$(at)
drill hang --set local.watchdog_ms=5000 drill hang-trainer --rank 0 --at "$A" --reference "$REF"; rc=$?
show hang
expect_rc $rc "kill -STOP of trainer 0 at iteration $A: detected by its silence, killed by the watchdog, same digest"
[ "$(jf "$WORK/hang.json" "d['kills'][0]['recovery']")" = hang ] &&
  grep -q '"event": *"watchdog".*"name": *"trainer-0"' "$WORK/hang/drill/run/events"
expect "  the oracle took it for hung (oracle.heartbeat_timeout_ms), the supervisor's watchdog killed it"

# ---- a hung embedding server (SIGSTOP) with durable writes: the watchdog kills it, the clients retry
A=$(at)
drill hang_emb --set embedding.sync_writes=true --set local.watchdog_ms=3000 drill hang-embedding --rank 1 --at "$A" --reference "$REF"; rc=$?
show hang_emb
expect_rc $rc "kill -STOP of embedding server 1 at iteration $A (sync_writes = true): the watchdog restarts it, same digest"
grep -q '"event": *"watchdog".*"name": *"embedding-1"' "$WORK/hang_emb/drill/run/events"
expect "  the supervisor's watchdog killed the stopped server"

# ---- a second kill while the job replays after the first
drill twice drill kill-trainer --rank 1 --at 60 --times 2 --reference "$REF"; rc=$?
show twice
expect_rc $rc "trainer 1 killed at iteration 60 and again while the job replayed: same digest"
[ "$(jf "$WORK/twice.json" "d['recoveries']")" -ge 2 ]; expect "  two recoveries"

# ---- SIGTERM of the oracle stops the job: the trainers exit 0 at once (they used to wait for ever)
job_up term
job_train term &
tp=$!
for _ in $(seq 1 300); do grep -qs "checkpoint part done" "$WORK/term/logs/trainer-0.log" && break; sleep 0.1; done
kill -TERM "$(awk '$1=="oracle-0"{print $2}' "$WORK/term/pids")"
t0=$SECONDS
for _ in $(seq 1 200); do
  [ "$(grep -c '"event": *"exit", "name": *"trainer-[01]".*"how": *"exit 0"' "$WORK/term/run/events" 2>/dev/null)" = 2 ] && break
  sleep 0.1
done
[ "$(grep -c '"event": *"exit", "name": *"trainer-[01]".*"how": *"exit 0"' "$WORK/term/run/events")" = 2 ] &&
  ! grep -q '"event": *"restart"' "$WORK/term/run/events"
expect_rc $? "SIGTERM of the oracle mid-job: both trainers exit 0 within $((SECONDS - t0)) s, nothing is restarted"
wait $tp; rc=$?
[ $rc -ne 0 ] && grep -q "stopped" "$WORK/term.err"
expect_rc $? "  chanter train says the job stopped: $(tail -1 "$WORK/term.err" | cut -c1-100)"
job_down term

# ---- repeated failures: a clear failure once the limit is reached
drill limit --set oracle.max_recoveries=1 drill kill-trainer --rank 1 --at 60 --times 2 --reference "$REF"; rc=$?
show limit
[ $rc -ne 0 ] && grep -q "oracle.max_recoveries = 1" "$WORK/limit/drill.train"
expect_rc $? "oracle.max_recoveries = 1 and two kills: the job fails, saying it gave up: $(grep -o 'giving up[^;]*' "$WORK/limit/drill.train" | head -1)"
finish
