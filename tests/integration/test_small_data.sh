#!/usr/bin/env bash
# Integration: a job on a dataset smaller than its batch -- a 200-line
# Criteo TSV (180 train / 20 test samples), as a small public sample is --
# with `chanter train --local` and on a tiny local cluster (a data
# processor, an embedding server, the oracle, one trainer):
#  - a batch larger than a split is said once at start, with how many
#    copies of the split it holds (stderr of both `train`s, the oracle's
#    log, summary.json's "warnings"); strict = true refuses it, saying so,
#    with a non-zero exit;
#  - an evaluation scores each test sample at most once: with
#    eval_batches x batch_size above the test split, test_samples_scored
#    is the split's size (also with a batch smaller than the split, whose
#    last eval batch is cut), and the printout says "scored N test samples";
#  - train logloss has one definition, named in summary.json
#    (train_logloss_definition, train_logloss_iterations), the same in both,
#    as are its value, the test metrics and the dense parameters for one
#    trainer.
source "$(dirname "$0")/lib.sh"

D=$WORK/small.tsv
"$BIN/chanter" data gen --out "$D" --samples 200 >/dev/null 2>&1
TEST_N=$("$BIN/chanter" --set dataset="$D" data stats "$D" --json 2>/dev/null | field - test_samples)
[ "$(wc -l <"$D")" -eq 200 ] && [ "$TEST_N" = 20 ]; expect "a 200-line Criteo TSV: 20 test samples"

JOB=$WORK/job.ini
cat >"$JOB" <<INI
dataset = $D
iterations = 6
trainers = 1
embedding_servers = 1
dataprocs = 1
cache_rows = 100000
[model]
bottom_mlp = 16
top_mlp = 16
[embedding]
hot_mb = 16
sync_writes = false
INI
TRAIN_WARN='batch_size = 1024 is larger than the train split (180 samples): each batch holds 5.7 copies of the training set; lower batch_size to at most 180 or use more data (strict = true refuses this)'
TEST_WARN='batch_size = 1024 is larger than the test split (20 samples): a test batch holds 51.2 copies of it; each evaluation scores the 20 test samples once (strict = true refuses this)'
REFUSE='strict = true refuses batch_size = 1024: it is larger than the train split (180 samples), each batch would hold 5.7 copies of the training set; lower batch_size to at most 180, use more data, or set strict = false'
DEF='mean of the per-iteration training logloss over the last 10% of iterations, at least one: the last 1 of 6'

# ---- train --local, the defaults' batch of 1024
C train --local --workdir "$WORK/local" >"$WORK/local.out" 2>"$WORK/local.err"; rc=$?
[ $rc -eq 0 ] && [ "$(grep -cF "chanter train --local: warning: $TRAIN_WARN" "$WORK/local.err")" -eq 1 ] &&
  [ "$(grep -cF "chanter train --local: warning: $TEST_WARN" "$WORK/local.err")" -eq 1 ]
expect "train --local warns once that each batch holds 5.7 copies of the training set (and 51.2 of the test split)"
python3 - "$WORK/local/summary.json" "$TRAIN_WARN" "$TEST_WARN" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["warnings"] == [sys.argv[2], sys.argv[3]], d["warnings"]
PY
expect "train --local: summary.json lists the two warnings"

C --set strict=true train --local --workdir "$WORK/lstrict" >"$WORK/lstrict.out" 2>"$WORK/lstrict.err"; rc=$?
[ $rc -ne 0 ] && grep -qF "chanter train --local: $REFUSE" "$WORK/lstrict.err" && [ ! -e "$WORK/lstrict/summary.json" ]
expect "train --local with strict = true refuses (exit $rc), saying why"

python3 - "$WORK/local/summary.json" "$TEST_N" "$DEF" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert d["test_samples_scored"] == n, d
assert abs(d["test_accuracy"] * n - round(d["test_accuracy"] * n)) < 1e-4, d  # a fraction of the 20 scored
assert d["train_logloss_definition"] == sys.argv[3] and d["train_logloss_iterations"] == 1, d
PY
expect "train --local: eval_batches x batch_size = 8192 > 20 test samples: test_samples_scored = 20, the train logloss defined"
grep -q "^test logloss .*(scored $TEST_N test samples)$" "$WORK/local.out" &&
  grep "^train logloss     [0-9.]* (" "$WORK/local.out" | grep -qF "($DEF)"
expect "train --local prints 'scored 20 test samples' and the train logloss's definition"

# a batch smaller than the test split, eval_batches x batch_size above it: the last eval batch is cut, no warning
C --set batch_size=8 train --local --workdir "$WORK/local8" >"$WORK/local8.out" 2>"$WORK/local8.err"
python3 -c "
import json; d=json.load(open('$WORK/local8/summary.json'))
assert d['test_samples_scored'] == $TEST_N and d['warnings'] == [], d"
[ $? -eq 0 ] && ! grep -q "warning" "$WORK/local8.err"
expect "train --local, batch 8, 8 eval batches: scores the 20 test samples once (3 batches, the last cut), no warning"

# ---- the same on a cluster (run_job: the train's exit status, 99 where the
# cluster did not come up; chanter train without --quiet: its printout is checked)
TRAIN_ARGS=

run_job c1
rc=$?
[ $rc -eq 0 ] && [ "$(grep -cF "chanter train: warning: $TRAIN_WARN" "$WORK/c1.err")" -eq 1 ] &&
  [ "$(grep -cF "chanter train: warning: $TEST_WARN" "$WORK/c1.err")" -eq 1 ]
expect "chanter train (cluster) prints the oracle's warnings once: 5.7 copies of the training set"
[ "$(grep -cF "WARN: $TRAIN_WARN" "$WORK/c1/logs/oracle-0.log")" -eq 1 ] &&
  [ "$(grep -cF "WARN: $TEST_WARN" "$WORK/c1/logs/oracle-0.log")" -eq 1 ]
expect "the oracle's log has each warning once"
grep -q "evaluation round=0 after_iteration=5: scored $TEST_N test samples" "$WORK/c1/logs/oracle-0.log" &&
  grep -q "^test logloss .*(scored $TEST_N test samples)$" "$WORK/c1.out" &&
  grep "^train logloss     [0-9.]* (" "$WORK/c1.out" | grep -qF "($DEF)"
expect "cluster: the oracle logs 'scored 20 test samples'; chanter train prints it and the train logloss's definition"
python3 - "$WORK/c1/summary.json" "$WORK/local/summary.json" "$TEST_N" "$TRAIN_WARN" "$TEST_WARN" <<'PY'
import json, sys
c, l = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n = int(sys.argv[3])
assert c["warnings"] == [sys.argv[4], sys.argv[5]], c["warnings"]
assert c["test_samples_scored"] == n == l["test_samples_scored"], (c, l)
assert c["train_logloss_definition"] == l["train_logloss_definition"], (c, l)
assert c["train_logloss_iterations"] == l["train_logloss_iterations"] == 1, (c, l)
# one trainer: the model of train --local, so the same train logloss and test metrics (it prints 6 decimals)
assert c["dense_sha256"] == l["dense_sha256"], (c, l)
assert abs(c["train_logloss"] - l["train_logloss"]) < 1e-5, (c["train_logloss"], l["train_logloss"])
assert abs(c["test_logloss"] - l["test_logloss"]) < 1e-5 and abs(c["test_auc"] - l["test_auc"]) < 1e-6, (c, l)
PY
expect "cluster summary.json: the warnings, test_samples_scored = 20, the same train logloss definition and values as train --local"

run_job c8 --set batch_size=8
rc=$?
python3 -c "
import json; c=json.load(open('$WORK/c8/summary.json')); l=json.load(open('$WORK/local8/summary.json'))
assert c['test_samples_scored'] == $TEST_N and c['warnings'] == [], c
assert c['dense_sha256'] == l['dense_sha256'] and abs(c['test_auc'] - l['test_auc']) < 1e-6, (c, l)"
[ $? -eq 0 ] && [ $rc -eq 0 ] && ! grep -q "warning" "$WORK/c8.err" &&
  grep -q "evaluation set ready: each evaluation scores $TEST_N test samples batches=3 eval_batches=8" "$WORK/c8/logs/oracle-0.log"
expect "cluster, batch 8: 3 eval batches, the last cut, 20 test samples scored; AUC as train --local's; no warning"

run_job cstrict --set strict=true
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 99 ] && grep -qF "chanter train: the job failed: $REFUSE" "$WORK/cstrict.err" &&
  grep -qF "job failed" "$WORK/cstrict/logs/oracle-0.log" && ! grep -q "iteration=1/" "$WORK/cstrict/logs/oracle-0.log"
expect "cluster with strict = true: the oracle refuses before training and chanter train exits $rc saying why"
finish
