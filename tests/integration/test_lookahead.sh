#!/usr/bin/env bash
# Integration: the guarantee of the lookahead cache on a real cluster (a
# data processor, two embedding servers, the oracle, two or three
# trainers, all over loopback gRPC and Gloo): for the same seed and
# allocation the model digest -- dense parameters plus every embedding row
# on the servers after the job -- is BIT-identical for L = 0 (the
# synchronous baseline), a small L without LRPP or delayed synchronization,
# a large L (which hits the cache, fetches fewer rows than L = 0 and delays
# some synchronizations), lookahead = auto, and a cache too small for the
# L asked (the oracle lowers L during the run).  The evaluation half-way
# and at the end reads cached rows from the trainers' caches: identical
# test loss too.  With three trainers the rows' gradients are summed in
# rank order, so the guarantee holds there as well; with allocation = laia
# too, which synchronizes fewer rows than contiguous and reports its
# placement in summary.json.  A cache too small for one batch fails the job
# naming cache_rows, at lookahead 4 and at 0 (no probe: the cacher says it).
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
# the cache is what this test checks (table_strategy = auto would partition its tables)
job_preamble "$JOB" table_strategy=cache iterations=120 eval_batches=10 eval_every=50
run_job base --set lookahead=0
expect_rc $? "baseline L = 0 trains (digest $(field "$WORK/base/summary.json" digest | cut -c1-16)...)"

run_job l16 --set lookahead=16 && same l16 base
expect "L = 16: bit-identical digest and test loss"
python3 -c "
import json; b=json.load(open('$WORK/base/summary.json')); d=json.load(open('$WORK/l16/summary.json'))
assert d['lookahead']==16 and d['cache_hits']>0 and d['rows_synced_delayed']>0, d
assert 0 < d['first_iteration_seconds'] < d['train_seconds'] and d['steady_samples_per_sec'] > 0, d
assert 0 < d['steady_iteration_seconds'] <= d['phase_seconds']['total'] * d['iterations'], d
assert d['rows_fetched'] < b['rows_fetched'], (d['rows_fetched'], b['rows_fetched'])"
expect "L = 16 hits the cache, fetches fewer rows than the baseline, delays some synchronization"

run_job l2 --set lookahead=2 --set lrpp=false --set delayed_sync=false && same l2 base
expect "L = 2 without LRPP or delayed synchronization: bit-identical"

run_job auto --set lookahead=auto && same auto base
expect_rc $? "lookahead = auto (chose L = $(field "$WORK/auto/summary.json" lookahead)): bit-identical"

run_job low --set lookahead=32 --set cache_rows=8000 && same low base && grep -qs "lookahead lowered" "$WORK/low/logs/"oracle*.log
expect_rc $? "L = 32 in a cache of 8000 rows: the oracle lowers L (to $(field "$WORK/low/summary.json" lookahead)) and the model is bit-identical"

err=$(job_stderr tiny --set lookahead=4 --set cache_rows=100); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *cache_rows* ]]
expect_rc $? "a cache too small for one batch fails the job naming cache_rows: $(echo "$err" | tail -1 | cut -c1-120)"
# the same at lookahead = 0, which has no probe: the cacher says it when it decides the batch
err=$(job_stderr tiny0 --set lookahead=0 --set cache_rows=100); rc=$?
[ $rc -ne 0 ] && [[ "$err" == *"cache_rows = 100"*"raise cache_rows"* ]]
expect_rc $? "lookahead = 0 with a cache too small for a batch fails naming cache_rows: $(echo "$err" | tail -1 | cut -c1-120)"

# allocation = laia: a different allocation (so a different summation
# order than contiguous), but one that depends only on the batches: any L
# still gives the same bits as L = 0 with it; and rows stay on one trainer,
# so fewer are synchronized than with contiguous at the same L.
run_job laia0 --set lookahead=0 --set allocation=laia && run_job laia16 --set lookahead=16 --set allocation=laia &&
  same laia0 laia16
expect "allocation = laia: L = 16 bit-identical to L = 0"
python3 -c "
import json; c=json.load(open('$WORK/l16/summary.json')); d=json.load(open('$WORK/laia16/summary.json'))
assert d['allocation']=='laia' and 0 < d['laia']['samples_on_holder'] <= d['laia']['samples_scored'] <= 1, d.get('laia')
assert d['rows_synced'] < c['rows_synced'], (d['rows_synced'], c['rows_synced'])
assert 0 < d['rows_replicated'] < c['rows_replicated'] < c['rows_synced'], (d['rows_replicated'], c['rows_replicated'])
print('rows synchronized (of which handed over) per iteration at L = 16: contiguous %.0f (%.0f), laia %.0f (%.0f)' % (c['rows_synced'], c['rows_replicated'], d['rows_synced'], d['rows_replicated']))"
expect "allocation = laia synchronizes fewer rows than contiguous (L = 16) and reports its placement in summary.json"

run_job p3base --set trainers=3 --set lookahead=0 && run_job p3l8 --set trainers=3 --set lookahead=8 &&
  [ "$(field "$WORK/p3base/summary.json" digest)" = "$(field "$WORK/p3l8/summary.json" digest)" ]
expect "three trainers: L = 8 bit-identical to L = 0 (rows summed in rank order)"
finish
