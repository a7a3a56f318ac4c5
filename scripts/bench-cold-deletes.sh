#!/usr/bin/env bash
# DELETEs (or overwrites, OP=SET) of cold keys on the hybrid tier, and what
# they do to the other requests of the same shards: redis-benchmark against
# ringkv's RESP listener, the WAL and the value segments on the `sas`
# profile, a 10 MiB cache, `--durability sync`.
#
#   1. load KEYS keys (100 B values, `key:NNNNNNNNNNNN`) with pipelined SETs,
#      then restart the server: nothing of them is in RAM;
#   2. write 100 hot keys (`hot:NNN...`), which stay in RAM;
#   3. run DELETES DELs (or SETs) of random cold keys from 8 clients and,
#      starting a second later, HOT_GETS GETs of the hot keys from 4
#      clients, at once.
#
# A shard whose deletes read the device on its own thread makes the hot
# GETs wait behind those reads; one that applies deletes without reading
# and reads their answers asynchronously does not (docs/storage.md,
# "Writes"). With OP=SET the cold requests are overwrites; with
# INDEX_KEYS small enough (its 32nd per shard is the unresolved set's
# bound) they run past the bound, where a build either reads on the shard
# thread or settles in the background. To compare two builds, run it once
# per build with BIN_DIR.
#
# Usage: scripts/bench-cold-deletes.sh
# Env:   KEYS (300000), DELETES (20000), HOT_GETS (40000), OP (DEL or SET),
#        INDEX_KEYS (3 x KEYS), WARM_COLD (cold requests made first, not
#        measured: 0),
#        BIN_DIR (binaries to use instead of a fresh release build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-common.sh

KEYS="${KEYS:-300000}"
DELETES="${DELETES:-20000}"
HOT_GETS="${HOT_GETS:-40000}"
OP="${OP:-DEL}"
INDEX_KEYS="${INDEX_KEYS:-$((KEYS * 3))}"
WARM_COLD="${WARM_COLD:-0}"
case "$OP" in
  DEL) COLD_CMD=(DEL key:__rand_int__) ;;
  SET) COLD_CMD=(SET key:__rand_int__ overwritten-value-of-forty-bytes-xxxxxx) ;;
  *) echo "OP must be DEL or SET" >&2; exit 2 ;;
esac
# Recovery replays the load's WAL when no checkpoint covered it yet.
READY_SECONDS=600

ensure_redis
ringkv_binaries
say "machine"
machine_line
cat >"$WORK/ringkv.toml" <<TOML
[storage]
tier = "hybrid"
cache_bytes = "10MiB"
index_keys = $INDEX_KEYS
[devices.wal]
path = ""
profile = "sas"
TOML

say "load $KEYS keys"
start_ringkv --config "$WORK/ringkv.toml"
redis-benchmark -p "$RINGKV_RESP_PORT" -t set -n $((KEYS * 2)) -r "$KEYS" -d 100 -c 16 -P 64 -q |
  tr '\r' '\n' | grep -v '^ *$' | tail -1
stop_pid "$RINGKV_PID"

say "restart (nothing cached), hot keys"
start_ringkv --config "$WORK/ringkv.toml"
echo "keys: $(redis-cli -p "$RINGKV_RESP_PORT" dbsize)"
redis-benchmark -p "$RINGKV_RESP_PORT" -n 20000 -r 100 -c 4 -P 16 -q SET hot:__rand_int__ hotvalue |
  tr '\r' '\n' | grep -v '^ *$' | tail -1

if [ "$WARM_COLD" -gt 0 ]; then
  say "$WARM_COLD cold ${OP}s first, not measured (to fill the unresolved set)"
  redis-benchmark -p "$RINGKV_RESP_PORT" -n "$WARM_COLD" -r "$KEYS" -c 8 -P 1 -q "${COLD_CMD[@]}" |
    tr '\r' '\n' | grep -v '^ *$' | tail -1
fi

say "$DELETES cold ${OP}s (8 clients) and $HOT_GETS hot GETs (4 clients) at once"
redis-benchmark -p "$RINGKV_RESP_PORT" -n "$DELETES" -r "$KEYS" -c 8 -P 1 "${COLD_CMD[@]}" \
  >"$WORK/cold.out" 2>&1 &
DEL_PID=$!
sleep 1
redis-benchmark -p "$RINGKV_RESP_PORT" -n "$HOT_GETS" -r 100 -c 4 -P 1 GET hot:__rand_int__ \
  >"$WORK/get.out" 2>&1
wait "$DEL_PID"
for what in cold get; do
  echo "-- $what"
  tr '\r' '\n' <"$WORK/$what.out" |
    grep -E "requests completed|throughput summary|avg +min" -A1 | grep -v '^--'
done
echo "keys: $(redis-cli -p "$RINGKV_RESP_PORT" dbsize)"
redis-cli -p "$RINGKV_RESP_PORT" info ringkv | tr -d '\r' |
  grep -E '^tier_(unresolved_entries|deleted_keys|cold_reads|settles_done):' || true
echo "(the hot GETs must finish before the ${OP}s for the whole run to be contended)"
