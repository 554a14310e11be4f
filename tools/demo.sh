#!/usr/bin/env bash
# make demo: the README's main command.  On the embedded default job
# (DLRM over a synthetic Criteo-like dataset: 13 dense features, 26 tables,
# dim 16), it starts a whole cluster on this machine -- 1 data processor,
# 2 embedding servers, the oracle, 2 trainers, all on 127.0.0.1 --, trains
# with a progress bar, prints the summary (and leaves summary.json in the
# work directory), tears the cluster down, and finally shows the embedding
# servers' own tools on the trained tables.
set -euo pipefail
BUILD=${1:-build}
BIN=$(cd "$BUILD/bin" && pwd)
KEEP=${CHANTER_WORKDIR:+1}
WORK=${CHANTER_WORKDIR:-$(mktemp -d /tmp/chanter-demo-XXXXXX)}
mkdir -p "$WORK"
# a demo-sized job: a few minutes on two cores
JOB=(--set iterations=600 --set batch_size=1024 --set eval_every=200 --set eval_batches=16
     --set synthetic.samples=1000000 --set trainers=2 --set embedding_servers=2 --set dataprocs=1
     --set embedding.hot_mb=256 --set embedding.sync_writes=false)
down() { "$BIN/chanter" local down --workdir "$WORK/cluster" >/dev/null 2>&1 || true; }
trap down EXIT

echo "== chanter demo: a local cluster training DLRM (work dir $WORK)"
"$BIN/chanter" "${JOB[@]}" local up --workdir "$WORK/cluster"
echo
"$BIN/chanter" --config "$WORK/cluster/job.ini" train --workdir "$WORK/cluster"
echo
echo "== the trained embedding tables, as the servers hold them"
"$BIN/chanter" --config "$WORK/cluster/job.ini" embedding stats | grep -E "^server|write-backs|memory tier"
"$BIN/chanter" --config "$WORK/cluster/job.ini" embedding lookup 0:1 2:123
echo
"$BIN/chanter" local down --workdir "$WORK/cluster"
trap - EXIT
echo "summary: $WORK/cluster/summary.json   logs: $WORK/cluster/logs/"
[ -n "$KEEP" ] || echo "(work dir $WORK is kept for you to look at; remove it when done)"
