#!/usr/bin/env bash
# Regenerates the seed corpora tests/fuzz/corpus/<target>/ (small, valid
# inputs each target starts from; committed, so this runs only when a
# format changes).  Protobuf seeds are built with protoc's Python stubs
# (make_seeds.py); data seeds with the CLI (`chanter data gen`, from the
# normal build: run `make` first); the job file seed is
# deploy/job.example.ini.
#   tests/fuzz/make_seeds.sh [BUILD_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-build}
CLI=$ROOT/$BUILD/bin/chanter
C=$ROOT/tests/fuzz/corpus
TMP=$(mktemp -d /tmp/chanter-seeds-XXXXXX)
trap 'rm -rf "$TMP"' EXIT

mkdir -p "$TMP/py"
protoc --python_out="$TMP/py" -I"$ROOT/proto" "$ROOT"/proto/{embedding,dataproc,oracle}.proto
# /usr/bin/python3: the Debian python3-protobuf (make deps), not a python of PATH
PYTHONPATH="$TMP/py" /usr/bin/python3 "$ROOT/tests/fuzz/make_seeds.py" "$C"

# the job file: the example job, and a small one with every list key
mkdir -p "$C/fuzz_cfg"
cp "$ROOT/deploy/job.example.ini" "$C/fuzz_cfg/job_example.ini"
cat >"$C/fuzz_cfg/small.ini" <<'INI'
# a small job
seed = 7
model = dlrm
batch_size = 64
n_dense = 2
table_rows = 100, 200,
  300
table_hotness = 1,2,1
[embedding]
hot_mb = 16
INI

# text data (3 modes: criteo; criteo, strict; avazu written by hand)
mkdir -p "$C/fuzz_data_text" "$C/fuzz_data_binary"
"$CLI" --set seed=3 data gen --out "$TMP/c.tsv" --format tsv --samples 6 >/dev/null
{ printf '\x00'; cat "$TMP/c.tsv"; } >"$C/fuzz_data_text/criteo"
{ printf '\x02'; head -c 400 "$TMP/c.tsv"; } >"$C/fuzz_data_text/criteo_cut_strict"
{
  printf '\x01'
  printf 'id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,app_category,device_id,device_ip,device_model,device_type,device_conn_type,C14,C15,C16,C17,C18,C19,C20,C21\r\n'
  for i in 1 2 3 4 5; do
    printf '%d,%d,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79\n' $i $((i % 2))
  done
} >"$C/fuzz_data_text/avazu"

# binary data for the fuzz_data_binary job (2 dense, hotness 1,2,1)
"$CLI" --set seed=3 --set n_dense=2 --set table_rows=100,200,300 --set table_hotness=1,2,1 \
  data gen --out "$TMP/b.bin" --format binary --samples 4 >/dev/null
{ printf '\x01'; cat "$TMP/b.bin"; } >"$C/fuzz_data_binary/gen4"
{ printf '\x00'; cat "$TMP/b.bin"; } >"$C/fuzz_data_binary/gen4_raw"
{ printf '\x01'; head -c 80 "$TMP/b.bin"; } >"$C/fuzz_data_binary/header_only"
ls -R "$C" | head -50
du -sh "$C"
