#!/usr/bin/env bash
# docs/benchmarks.md, "Memory tier steady state (issue 48)": how steady
# durable SETs are while checkpoints run. One ringkv-server (memory tier,
# `--durability sync`, 2 shards, the default unthrottled device) takes
# `redis-benchmark -t set -d 1000 -c 16 -r 100000 -P 16 -n REQUESTS` on its
# RESP port; INFO's total_commands_processed is read every second for 62 s,
# and the seconds 3..62 give the median and the slowest rate; then
# redis-benchmark's own latency summary (p50, p99 and max per request) is
# printed once its requests are done. The server logs each checkpoint at
# debug level; their count over the run is printed.
#
# Usage: scripts/bench-resp-steadiness.sh SERVER_BINARY LABEL [LABEL2 ...]
#        (one run per label, each on a fresh data directory)
# Env:   OUT (results dir; the data directories are removed after each run),
#        REQUESTS (redis-benchmark's -n, 36000000: over a minute here, so
#        that its latency summary, p50 and p99 per request, is printed)
set -u
REQUESTS="${REQUESTS:-36000000}"
BIN=$1
shift
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/bench-resp-steadiness.XXXXXX")}"
for LABEL in "$@"; do
  D="$OUT/$LABEL"
  rm -rf "$D"
  mkdir -p "$D"
  RUST_LOG=info,ringkv_engine::shard::checkpoint=debug "$BIN" --data-dir "$D/data" \
    --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 --durability sync --shards 2 >"$D/log" 2>&1 &
  SP=$!
  for _ in $(seq 100); do grep -q "engine open" "$D/log" && break; sleep 0.1; done
  sleep 1
  P=$(grep -o "resp=127.0.0.1:[0-9]*" "$D/log" | head -1 | cut -d: -f2)
  redis-benchmark -p "$P" -t set -d 1000 -c 16 -r 100000 -P 16 -n "$REQUESTS" >"$D/rb.out" 2>&1 &
  BP=$!
  count() { redis-cli -p "$P" INFO stats | grep total_commands_processed | cut -d: -f2 | tr -d '\r'; }
  prev=$(count)
  : >"$D/rates"
  for _ in $(seq 62); do
    sleep 1
    cur=$(count)
    echo $((cur - prev)) >>"$D/rates"
    prev=$cur
  done
  # Its latency summary comes when its REQUESTS are done; it is stopped
  # (and has none) if they take more than another minute.
  for _ in $(seq 60); do kill -0 "$BP" 2>/dev/null || break; sleep 1; done
  kill "$BP" 2>/dev/null
  wait "$BP" 2>/dev/null
  kill "$SP"
  wait "$SP" 2>/dev/null
  echo "$LABEL: load $(cut -d' ' -f1-3 /proc/loadavg), checkpoints written: $(grep -c "checkpoint written" "$D/log")"
  python3 - "$D/rates" "$LABEL" <<'PY'
import statistics, sys
r = [int(x) for x in open(sys.argv[1]) if x.strip()][2:62]
m, lo = statistics.median(r), min(r)
print(f"{sys.argv[2]}: {len(r)} s, median {m:.0f}/s, slowest {lo}/s, slowest/median {lo / m:.0%}")
PY
  python3 - "$D/rb.out" "$LABEL" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read().replace("\r", "\n")
m = re.search(r"latency summary \(msec\):\s*\n\s*avg.*\n\s*([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text)
if m:
    p50, p99, mx = float(m.group(3)), float(m.group(5)), float(m.group(6))
    print(f"{sys.argv[2]}: request latency p50 {p50} ms, p99 {p99} ms (p99/p50 {p99 / p50:.1f}x), max {mx} ms")
else:
    print(f"{sys.argv[2]}: no latency summary (REQUESTS not done in time)")
PY
  rm -rf "$D/data"
done
