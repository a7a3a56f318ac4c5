#!/bin/bash
# docs/benchmarks.md, "Durable write path (issue 29): several flushes in flight".
# A/B: durable one-op PUTs (ringkv-bench -P 1, 16 connections, 1000-byte values,
# durability sync, 2 shards, unthrottled) with wal_flushes_in_flight = 1 vs 4,
# alternating, ROUNDS rounds each; server CPU per op from /usr/bin/time.
set -u
BIN=${BIN:-target/release}   # ringkv-server and examples/ringkv-bench, release build
ROUNDS=${ROUNDS:-3}
N=${N:-200000}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ringkv-inflight.XXXXXX")
OUT=${OUT:-$WORK/results.txt}
: > "$OUT"
for round in $(seq "$ROUNDS"); do
  for k in 1 4; do
    W=$(mktemp -d "$WORK/run.XXXXXX")
    printf '[storage]\nwal_flushes_in_flight = %s\n' "$k" > "$W/cfg.toml"
    mkdir -p "$W/data"
    RUST_LOG=info nice -n 19 /usr/bin/time -f "CPU %U %S" -o "$W/time" "$BIN/ringkv-server" --config "$W/cfg.toml" \
      --data-dir "$W/data" --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 --durability sync \
      --shards 2 --device-profile unthrottled > "$W/log" 2>&1 &
    TPID=$!
    for _ in $(seq 300); do grep -q "ringkv-server ready" "$W/log" && break; sleep 0.1; done
    ADDR=$(grep "ringkv-server ready" "$W/log" | head -1 | sed -n 's/.*addr=\([0-9.]*:[0-9]*\).*/\1/p')
    if [ -z "$ADDR" ]; then echo "no ready line"; cat "$W/log"; kill $TPID; exit 1; fi
    nice -n 19 "$BIN/examples/ringkv-bench" --server "$ADDR" -c 16 -P 1 -d 1000 -r 1000000 -n "$N" --seed "$round" > "$W/bench" 2>&1
    SPID=$(pgrep -P $TPID -f ringkv-server | head -1)
    [ -n "$SPID" ] && kill -TERM "$SPID"
    wait $TPID
    R=$(grep '^RESULT' "$W/bench" | head -1)
    echo "round=$round k=$k $(cat "$W/time" | tail -1) $R" | tee -a "$OUT"
    rm -rf "$W/data"
  done
done
