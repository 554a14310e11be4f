#!/usr/bin/env bash
# make demo: the README's main command.  Until the training path lands
# (issues 3-5), the demo brings up a local pair of embedding servers on the
# default job configuration (Criteo-like: 26 tables, dim 16), drives them
# the way a trainer will -- lookups of lazily initialized rows, durable
# write-backs, a digest, a checkpoint -- prints what they report, and stops
# them.  Everything runs on 127.0.0.1 in a temporary work directory.
set -euo pipefail
BUILD=${1:-build}
BIN=$(cd "$BUILD/bin" && pwd)
KEEP=${CHANTER_WORKDIR:+1}
WORK=${CHANTER_WORKDIR:-$(mktemp -d /tmp/chanter-demo-XXXXXX)}
mkdir -p "$WORK"
PIDS=()
stop() { for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null; done; wait 2>/dev/null || true; }
trap stop EXIT

echo "== chanter demo: 2 embedding servers on the default job (work dir $WORK)"
PORTS=()
for s in 0 1; do
  "$BIN/chanter-embedding" --shard "$s" --listen 127.0.0.1:0 --data-dir "$WORK/embedding-$s" \
      --set embedding.hot_mb=64 --ready-file "$WORK/emb-$s.ready" 2>"$WORK/emb-$s.log" &
  PIDS+=($!)
done
for s in 0 1; do
  for _ in $(seq 1 200); do [ -f "$WORK/emb-$s.ready" ] && break; sleep 0.05; done
  [ -f "$WORK/emb-$s.ready" ] || { echo "shard $s did not start:"; cat "$WORK/emb-$s.log"; exit 1; }
  PORTS+=("$(sed -E 's/.*"rpc_port": ([0-9]+).*/\1/' "$WORK/emb-$s.ready")")
  echo "   shard $s ready on 127.0.0.1:${PORTS[$s]}  (log $WORK/emb-$s.log)"
done
C=(--set "cluster.embedding=127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]}")
chanter() { "$BIN/chanter" "${C[@]}" "$@"; }

echo; echo "== lookup: rows never written are initialized from (seed, key), identically every time"
chanter embedding lookup 0:1 2:123456 25:7
echo; echo "== write-back (acknowledged once in RocksDB's write-ahead log), then read back"
chanter embedding write 2:123456=0.5,0.25,0.125,0,0,0,0,0,0,0,0,0,0,0,0,1
chanter embedding lookup 2:123456
echo; echo "== digest: SHA-256 of every stored row, per server and combined"
chanter embedding digest
echo; echo "== checkpoint on every server"
chanter embedding checkpoint demo-1
echo; echo "== stats"
chanter embedding stats
echo; echo "== stopping (SIGTERM drains in-flight calls and closes RocksDB)"
stop
trap - EXIT

echo; echo "== chanter train --local: DLRM on the default synthetic Criteo-like data, one process"
"$BIN/chanter" --set iterations=300 --set batch_size=1024 --set eval_batches=20 \
    --set synthetic.samples=400000 train --local --workdir "$WORK/train"
[ -n "$KEEP" ] || rm -rf "$WORK"
echo "demo done; distributed training arrives with the oracle and trainers (see README, 'Status')."
