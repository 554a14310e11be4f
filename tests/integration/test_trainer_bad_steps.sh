#!/usr/bin/env bash
# Integration: chanter-trainer against a fake oracle (Python grpcio,
# tests/integration/fake_oracle.py) that sends it one malformed Step --
# slots short of the ids, a slot beyond the cache, fetch keys and slots of
# different lengths, a replication owner that is no trainer, write-back
# keys and slots of different lengths, id bytes short of the samples, and
# the partitioned tables' fields (table_strategy: an owner that is no
# trainer, ids where a lone trainer takes them all from its samples, a
# sample's id beyond its partitioned table, slots for a partitioned
# table's ids, sample counts that disagree with the step).  Each
# time the trainer stops with exit status 1 and a log line naming the
# iteration and the field; no crash, no hang (a malformed message from a
# peer is that peer's bug, reported, never undefined behaviour).  And
# device = cuda without a GPU: refused at start, saying why.
source "$(dirname "$0")/lib.sh"

STUBS=$WORK/stubs
mkdir -p "$STUBS"
if ! protoc -I "$ROOT/proto" --python_out="$STUBS" --grpc_python_out="$STUBS" \
     --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" "$ROOT/proto/oracle.proto" 2>"$WORK/protoc.err"; then
  nok "python stubs generated: $(cat "$WORK/protoc.err")"
  finish
  exit
fi

JOB=$WORK/job.ini
cat >"$JOB" <<INI
; the Steps of the cache (the part_ cases carry their own owners)
table_strategy = cache
trainers = 1
batch_size = 4
iterations = 3
n_dense = 2
table_rows = 50, 40
table_hotness = 1, 1
embedding_dim = 4
cache_rows = 100
lookahead = 1
embedding_servers = 1
[cluster]
; never contacted: no Step here fetches a row
embedding = 127.0.0.1:1
[model]
bottom_mlp = 8
top_mlp = 8
[rpc]
timeout_ms = 3000
INI

# case -> what the trainer's log must say
declare -A NEED=(
  [slots_short]="slots has 12 bytes, want 32"
  [slot_beyond_cache]="beyond the cache of 100 rows"
  [fetch_slots_mismatch]="fetch_slots has 4 bytes, want 8"
  [replicate_owner]="replicate_owners[0] = 5, only 1 trainers"
  [write_back_slots]="write_back_slots has 12 bytes, want 8"
  [samples_bytes]="id bytes"
  [part_owner_rank]="partition_owner[1] = 5, only 1 trainers"
  [part_ids_short]="partition_ids has 16 bytes, want 0"
  [part_id_beyond]="partition_ids[3] = 40 for table 1 of 40 rows"
  [part_slot]="slots has 32 bytes, want 16 (4 per id of the cached tables)"
  [part_counts]="partition_counts says 3 samples for rank 0, the step has 4"
)
for c in slots_short slot_beyond_cache fetch_slots_mismatch replicate_owner write_back_slots samples_bytes \
         part_owner_rank part_ids_short part_id_beyond part_slot part_counts; do
  rm -f "$WORK/port"
  /usr/bin/python3 "$ROOT/tests/integration/fake_oracle.py" "$STUBS" "$WORK/port" "$c" >"$WORK/oracle-$c.log" 2>&1 &
  op=$!
  PIDS+=("$op")
  for _ in $(seq 1 200); do [ -f "$WORK/port" ] && break; sleep 0.05; done
  port=$(cat "$WORK/port" 2>/dev/null)
  timeout 60 "$BIN/chanter-trainer" --config "$JOB" --rank 0 --set "cluster.oracle=127.0.0.1:$port" \
    --set trainer.metrics_port=0 >"$WORK/trainer-$c.log" 2>&1
  rc=$?
  kill "$op" 2>/dev/null; wait "$op" 2>/dev/null
  [ $rc -eq 1 ] && grep -q "iteration 0" "$WORK/trainer-$c.log" && grep -qF "${NEED[$c]}" "$WORK/trainer-$c.log"
  expect_rc $? "$c: the trainer exits 1 naming it: $(grep -m1 -o 'trainer failed.*' "$WORK/trainer-$c.log" | cut -c1-150)"
done

# device = cuda on a machine without a GPU (or a build without CUDA): the
# trainer refuses at start, saying why, before it contacts anyone; never a
# silent run on the CPU.  A GPU this machine may have is hidden from it.
CUDA_VISIBLE_DEVICES="" timeout 60 "$BIN/chanter-trainer" --config "$JOB" --rank 0 --set cluster.oracle=127.0.0.1:1 \
  --set device=cuda --set trainer.metrics_port=0 >"$WORK/trainer-cuda.log" 2>&1
rc=$?
[ $rc -eq 1 ] && { grep -q "no CUDA device.*use device = cpu" "$WORK/trainer-cuda.log" ||
  grep -q "built without CUDA.*use device = cpu" "$WORK/trainer-cuda.log"; }
expect_rc $? "device = cuda without a GPU: exit 1 saying so: $(grep -m1 -io 'cuda.*' "$WORK/trainer-cuda.log" | cut -c1-150)"
finish
