#!/usr/bin/env bash
# ringkv vs Redis 7, durable writes, same machine, same run.
#
# Redis: `redis-server --appendonly yes --appendfsync always` (every write
# fsync'ed before it is acknowledged), measured with
#   redis-benchmark -t set,get -d 1000 -r 1000000 -n 2000000 -c 16 --threads 2 -P 1000
# ringkv: `ringkv-server --durability sync` (every write fdatasync'ed before
# it is acknowledged), measured with the same shape by ringkv-bench
# (server/examples/ringkv-bench.rs): 16 connections, batches of 1,000 PUTs
# of 1,000-byte values on random keys out of 1,000,000, then 1,000 GETs.
#
# Both servers run on loopback with their files in a temp dir that is
# removed at the end; both are stopped on exit (trap). Each round runs Redis
# then ringkv; the script prints every round, the medians and the ratios.
#
# Usage: scripts/bench-vs-redis.sh [ROUNDS=3]
# Env:   REQUESTS (2000000), KEYS (1000000), CONNECTIONS (16), BATCH (1000),
#        VALUE_BYTES (1000), RINGKV_SHARDS (0 = one per core),
#        RINGKV_DEVICE_PROFILE (unthrottled)
#
# Ports: ringkv-server listens on a port the kernel picks (--listen
# 127.0.0.1:0; the script reads it from the "ready" line). Redis cannot take
# port 0, so the script asks the kernel for a free port, starts Redis on it,
# and then checks that the Redis answering there is the one it started (its
# process_id) and that it runs with appendfsync always; anything else aborts
# the run instead of measuring a stranger.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-3}"
REQUESTS="${REQUESTS:-2000000}"
KEYS="${KEYS:-1000000}"
CONNECTIONS="${CONNECTIONS:-16}"
BATCH="${BATCH:-1000}"
VALUE_BYTES="${VALUE_BYTES:-1000}"
RINGKV_SHARDS="${RINGKV_SHARDS:-0}"
RINGKV_DEVICE_PROFILE="${RINGKV_DEVICE_PROFILE:-unthrottled}"

say() { printf '\n=== %s\n' "$*"; }

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  say "installing redis-server and redis-tools"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi
# The Debian package starts a system Redis on 6379; it is not used here.

say "building (release)"
cargo build --release -q -p ringkv-server --bin ringkv-server --example ringkv-bench
SERVER=target/release/ringkv-server
BENCH=target/release/examples/ringkv-bench

WORK="$(mktemp -d -t ringkv-vs-redis.XXXXXX)"
RINGKV_PID=""
REDIS_PID=""
cleanup() {
  set +e
  if [ -n "$RINGKV_PID" ] && kill -0 "$RINGKV_PID" 2>/dev/null; then
    kill -TERM "$RINGKV_PID"
    for _ in $(seq 100); do kill -0 "$RINGKV_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$RINGKV_PID" 2>/dev/null
  fi
  if [ -n "$REDIS_PID" ] && kill -0 "$REDIS_PID" 2>/dev/null; then
    kill -TERM "$REDIS_PID"
    for _ in $(seq 100); do kill -0 "$REDIS_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$REDIS_PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

say "machine"
echo "cores: $(nproc), memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), kernel: $(uname -r)"
echo "redis: $(redis-server --version)"
echo "ringkv: $($SERVER --version)"
echo "shape: -n $REQUESTS -r $KEYS -c $CONNECTIONS -P $BATCH -d $VALUE_BYTES, $ROUNDS rounds"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
REDIS_PORT=$(free_port)
say "starting redis (AOF, appendfsync always) on 127.0.0.1:$REDIS_PORT"
mkdir -p "$WORK/redis"
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" --save '' \
  --appendonly yes --appendfsync always --daemonize no >"$WORK/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$REDIS_PORT" ping >/dev/null
# The Redis on that port must be ours, with every write fsync'ed.
redis_pid=$(redis-cli -p "$REDIS_PORT" info server | tr -d '\r' | sed -n 's/^process_id://p')
[ "$redis_pid" = "$REDIS_PID" ] || { echo "port $REDIS_PORT answers as pid '$redis_pid', not the Redis started here ($REDIS_PID)"; exit 1; }
fsync_mode=$(redis-cli -p "$REDIS_PORT" config get appendfsync | tr -d '\r' | sed -n 2p)
[ "$fsync_mode" = "always" ] || { echo "Redis runs with appendfsync '$fsync_mode', not 'always'"; exit 1; }
echo "redis pid $redis_pid, appendfsync $fsync_mode"

say "starting ringkv-server (durability sync) on a kernel-picked port"
mkdir -p "$WORK/ringkv"
RUST_LOG=info "$SERVER" --data-dir "$WORK/ringkv" --listen "127.0.0.1:0" \
  --durability sync --shards "$RINGKV_SHARDS" --device-profile "$RINGKV_DEVICE_PROFILE" \
  >"$WORK/ringkv.log" 2>&1 &
RINGKV_PID=$!
for _ in $(seq 300); do
  grep -q "ringkv-server ready" "$WORK/ringkv.log" && break
  kill -0 "$RINGKV_PID" 2>/dev/null || { cat "$WORK/ringkv.log"; exit 1; }
  sleep 0.1
done
grep "ringkv-server ready" "$WORK/ringkv.log" | sed 's/^.*ringkv-server ready/ringkv-server ready/'
RINGKV_ADDR=$(grep "ringkv-server ready" "$WORK/ringkv.log" | sed -n 's/.*addr=\([0-9.]*:[0-9]*\).*/\1/p' | head -1)
[ -n "$RINGKV_ADDR" ] || { echo "no address in the ready line"; cat "$WORK/ringkv.log"; exit 1; }

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

: >"$WORK/redis_set" ; : >"$WORK/redis_get" ; : >"$WORK/ringkv_put" ; : >"$WORK/ringkv_get"
for round in $(seq "$ROUNDS"); do
  say "round $round/$ROUNDS: redis-benchmark"
  redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -t set,get -d "$VALUE_BYTES" -r "$KEYS" \
    -n "$REQUESTS" -c "$CONNECTIONS" --threads 2 -P "$BATCH" --csv >"$WORK/redis.csv"
  cat "$WORK/redis.csv"
  awk -F'"' '$2=="SET" {print $4}' "$WORK/redis.csv" >>"$WORK/redis_set"
  awk -F'"' '$2=="GET" {print $4}' "$WORK/redis.csv" >>"$WORK/redis_get"

  say "round $round/$ROUNDS: ringkv-bench"
  "$BENCH" --server "$RINGKV_ADDR" -c "$CONNECTIONS" -P "$BATCH" -d "$VALUE_BYTES" \
    -r "$KEYS" -n "$REQUESTS" --seed "$round" | tee "$WORK/ringkv.out"
  sed -n 's/^RESULT .*put_ops_per_sec=\([0-9]*\).*/\1/p' "$WORK/ringkv.out" >>"$WORK/ringkv_put"
  sed -n 's/^RESULT .*get_ops_per_sec=\([0-9]*\).*/\1/p' "$WORK/ringkv.out" >>"$WORK/ringkv_get"
done

REDIS_SET=$(median <"$WORK/redis_set")
REDIS_GET=$(median <"$WORK/redis_get")
RINGKV_PUT=$(median <"$WORK/ringkv_put")
RINGKV_GET=$(median <"$WORK/ringkv_get")

say "medians of $ROUNDS rounds (ops/s)"
printf '%-28s %12s %12s\n' "" "write/s" "read/s"
printf '%-28s %12.0f %12.0f\n' "redis AOF always (SET/GET)" "$REDIS_SET" "$REDIS_GET"
printf '%-28s %12.0f %12.0f\n' "ringkv sync (PUT/GET)" "$RINGKV_PUT" "$RINGKV_GET"
awk -v a="$RINGKV_PUT" -v b="$REDIS_SET" -v c="$RINGKV_GET" -v d="$REDIS_GET" \
  'BEGIN {printf "%-28s %11.1fx %11.1fx\n", "ringkv / redis", a/b, c/d}'
echo "per round: redis SET $(paste -sd' ' "$WORK/redis_set") | GET $(paste -sd' ' "$WORK/redis_get")"
echo "per round: ringkv PUT $(paste -sd' ' "$WORK/ringkv_put") | GET $(paste -sd' ' "$WORK/ringkv_get")"
# Ratios within each round (Redis and ringkv measured one after the other), and
# their medians: the noise of a shared machine shows here.
paste "$WORK/ringkv_put" "$WORK/redis_set" | awk '{printf "%.1f\n", $1/$2}' >"$WORK/ratio_put"
paste "$WORK/ringkv_get" "$WORK/redis_get" | awk '{printf "%.1f\n", $1/$2}' >"$WORK/ratio_get"
echo "per round: ratio PUT/SET $(paste -sd' ' "$WORK/ratio_put") (median $(median <"$WORK/ratio_put"))" \
  "| GET/GET $(paste -sd' ' "$WORK/ratio_get") (median $(median <"$WORK/ratio_get"))"
