#!/usr/bin/env bash
# What the durable mark costs (docs/wal.md, "The durable mark"): the same
# durable SET load against a server that writes the mark every 100 ms (the
# default) and one that writes it once a minute, interleaved, three rounds.
# Prints redis-benchmark's CSV line, the server's CPU ticks (utime+stime
# from /proc/PID/stat over the run) and the load average per run.
#
# Usage: scripts/bench-durable-mark.sh   (builds the release server first)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ringkv-server
bin=target/release/ringkv-server
work=$(mktemp -d /tmp/ringkv-mark-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

for round in 1 2 3; do
  for interval in 100ms 60s; do
    dir=$(mktemp -d "$work/run.XXXX")
    printf '[storage]\nwal_mark_interval = "%s"\n' "$interval" > "$dir/ringkv.toml"
    "$bin" --config "$dir/ringkv.toml" --data-dir "$dir/data" --durability sync \
      --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 > "$dir/log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do grep -q "ringkv-server ready" "$dir/log" && break; sleep 0.1; done
    port=$(grep -o 'resp=127.0.0.1:[0-9]*' "$dir/log" | head -1 | cut -d: -f2)
    before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    line=$(redis-benchmark -h 127.0.0.1 -p "$port" -t set -d 100 -c 50 -r 100000 -P 16 -n 1000000 --csv | tail -1)
    after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
    echo "round=$round wal_mark_interval=$interval $line cpu_ticks=$((after - before)) load=$(cut -d' ' -f1 /proc/loadavg)"
    kill -TERM "$pid"
    wait "$pid" 2>/dev/null || true
  done
done
