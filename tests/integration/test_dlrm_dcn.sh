#!/usr/bin/env bash
# Integration: model = dlrm_dcn (MLPerf DLRMv2's model: DCNv2 cross layers
# between DLRM's MLPs) end to end.
#   - `train --local` learns the planted synthetic signal with full-rank and
#     low-rank cross layers, next to dlrm on the same data and iterations
#     (both AUCs are printed; the bound is on each alone), and the same job
#     twice gives the same digest;
#   - on a local cluster (a data processor, two embedding servers, the
#     oracle, two trainers) it learns too, and lookahead = 0 (the
#     synchronous baseline) and lookahead = auto end with the same digest
#     and test loss; one trainer on the cluster ends with exactly the dense
#     parameters of train --local;
#   - deploy/jobs/mlperf-dlrmv2.ini is a valid job (config show reads it,
#     with table_scale applied: its 40M-row tables hold 625,000 rows).
#
# Thresholds as tests/integration/test_train_local.sh: test AUC > 0.65 (the
# planted logit reaches ~0.83, chance is 0.5; a model that learned nothing
# stays within ~0.02 of 0.5 on these 10240 test samples).
source "$(dirname "$0")/lib.sh"

JOB=$WORK/job.ini
cat >"$JOB" <<INI
iterations = 400
batch_size = 256
learning_rate = 0.1
eval_batches = 40
[synthetic]
samples = 200000
[model]
bottom_mlp = 64,32
top_mlp = 64
cross_layers = 3
INI

train_local --set model=dlrm >"$WORK/dlrm.json" 2>"$WORK/dlrm.err"
expect_rc $? "dlrm trains (the baseline: test AUC $(field "$WORK/dlrm.json" test_auc))"
for r in 0 8; do
  train_local --set model=dlrm_dcn --set model.cross_rank=$r >"$WORK/dcn$r.json" 2>"$WORK/dcn$r.err"
  python3 -c "import json; d=json.load(open('$WORK/dcn$r.json')); assert d['test_auc'] > 0.65, d; assert d['test_logloss'] < 0.6, d"
  expect_rc $? "dlrm_dcn, model.cross_rank = $r, learns the planted signal (test AUC $(field "$WORK/dcn$r.json" test_auc), dlrm $(field "$WORK/dlrm.json" test_auc), same data and iterations)"
done
train_local --set model=dlrm_dcn --set model.cross_rank=8 >"$WORK/dcn8b.json" 2>/dev/null
[ "$(field "$WORK/dcn8.json" digest)" = "$(field "$WORK/dcn8b.json" digest)" ]
expect "dlrm_dcn: the same job twice, the same digest"

# on a cluster: the cache is what L changes (table_strategy = auto would
# partition these small tables)
CJOB=$WORK/cluster.ini
job_preamble "$CJOB" model=dlrm_dcn model.cross_rank=8 model.cross_layers=2 table_strategy=cache iterations=150 \
  eval_batches=20 eval_every=75
JOB=$CJOB
run_job base --set lookahead=0
python3 -c "import json; d=json.load(open('$WORK/base/summary.json')); assert d['test_auc'] > 0.6, d"
expect_rc $? "dlrm_dcn learns on a local cluster of two trainers, L = 0 (test AUC $(field "$WORK/base/summary.json" test_auc))"
run_job auto --set lookahead=auto && same auto base
expect_rc $? "lookahead = auto (chose L = $(field "$WORK/auto/summary.json" lookahead)): the digest and test loss of L = 0"
run_job p1 --set trainers=1 --set lookahead=auto
C --set trainers=1 --json train --local --quiet >"$WORK/local1.json" 2>/dev/null
[ "$(field "$WORK/p1/summary.json" dense_sha256)" = "$(field "$WORK/local1.json" dense_sha256)" ]
expect "one trainer on the cluster ends with exactly the dense parameters of train --local"

# the MLPerf job file reads, its tables scaled
"$CHANTER" --config "$ROOT/deploy/jobs/mlperf-dlrmv2.ini" config show >"$WORK/mlperf.ini" 2>"$WORK/mlperf.err" &&
  grep -q "^model = dlrm_dcn" "$WORK/mlperf.ini" && grep -q "^table_scale = 64" "$WORK/mlperf.ini"
expect "deploy/jobs/mlperf-dlrmv2.ini is a valid job (model = dlrm_dcn, table_scale = 64)"
finish
