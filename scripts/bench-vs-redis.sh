#!/usr/bin/env bash
# ringkv vs Redis 7, durable writes, same machine, same run: the four rows
# of issue 12 (1,000-byte values, 16 connections, random keys).
#
#   batched    Redis: redis-benchmark -t set,get -P 1000 -n REQUESTS
#              ringkv: ringkv-bench -P 1000 -n REQUESTS (batches of 1,000)
#   unbatched  Redis: redis-benchmark -t set,get -P 1 -n REQUESTS_P1
#              ringkv: ringkv-bench -P 1 -n REQUESTS_P1 (one op per request)
#
# Redis runs with `--appendonly yes --appendfsync always` (every write
# fsync'ed before it is acknowledged), ringkv with `--durability sync`
# (every write fdatasync'ed before it is acknowledged). Each round runs
# Redis then ringkv for each row; the script prints every round, the
# medians, the ratio of medians and the per-round ratios, and for the
# unbatched rows the p99 latencies. With RESP=1 it also runs
# redis-benchmark against ringkv's RESP listener and against Redis (the
# rows of scripts/bench-resp-vs-redis.sh, which shares this code).
#
# Usage: scripts/bench-vs-redis.sh [ROUNDS=3]
# Env:   REQUESTS (2000000), REQUESTS_P1 (200000), KEYS (1000000),
#        CONNECTIONS (16), BATCH (1000), VALUE_BYTES (1000),
#        RINGKV_SHARDS (0 = one per core), RINGKV_DEVICE_PROFILE
#        (unthrottled), BIN_DIR (use ringkv-server and ringkv-bench from
#        there instead of building, e.g. a saved baseline), ROWS ("batched
#        unbatched"), RESP (0)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-common.sh

ROUNDS="${1:-3}"
REQUESTS="${REQUESTS:-2000000}"
REQUESTS_P1="${REQUESTS_P1:-200000}"
KEYS="${KEYS:-1000000}"
CONNECTIONS="${CONNECTIONS:-16}"
BATCH="${BATCH:-1000}"
VALUE_BYTES="${VALUE_BYTES:-1000}"
RINGKV_SHARDS="${RINGKV_SHARDS:-0}"
RINGKV_DEVICE_PROFILE="${RINGKV_DEVICE_PROFILE:-unthrottled}"
ROWS="${ROWS:-batched unbatched}"
RESP="${RESP:-0}"

ensure_redis
say "binaries"
ringkv_binaries
echo "server: $SERVER; bench: $BENCH"

say "machine"
machine_line
echo "redis: $(redis-server --version)"
echo "ringkv: $($SERVER --version)"
echo "shape: -r $KEYS -c $CONNECTIONS -d $VALUE_BYTES; batched -P $BATCH -n $REQUESTS; unbatched -P 1 -n $REQUESTS_P1; rows: $ROWS; $ROUNDS rounds"

say "starting redis (AOF, appendfsync always)"
start_redis
say "starting ringkv-server (durability sync)"
start_ringkv --shards "$RINGKV_SHARDS" --device-profile "$RINGKV_DEVICE_PROFILE"

# One file of numbers per (row, server, op): $WORK/<row>_<server>_<op>.
for round in $(seq "$ROUNDS"); do
  for row in $ROWS; do
    case $row in
      batched) P=$BATCH; N=$REQUESTS ;;
      unbatched) P=1; N=$REQUESTS_P1 ;;
      *) echo "unknown row $row"; exit 1 ;;
    esac
    say "round $round/$ROUNDS, $row (-P $P -n $N): redis-benchmark (load $(cut -d' ' -f1 /proc/loadavg))"
    redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -t set,get -d "$VALUE_BYTES" -r "$KEYS" \
      -n "$N" -c "$CONNECTIONS" --threads 2 -P "$P" --csv >"$WORK/redis.csv"
    cat "$WORK/redis.csv"
    awk -F'"' '$2=="SET" {print $4}' "$WORK/redis.csv" >>"$WORK/${row}_redis_put"
    awk -F'"' '$2=="GET" {print $4}' "$WORK/redis.csv" >>"$WORK/${row}_redis_get"
    awk -F'"' '$2=="SET" {print $14}' "$WORK/redis.csv" >>"$WORK/${row}_redis_put_p99"
    awk -F'"' '$2=="GET" {print $14}' "$WORK/redis.csv" >>"$WORK/${row}_redis_get_p99"

    say "round $round/$ROUNDS, $row (-P $P -n $N): ringkv-bench (load $(cut -d' ' -f1 /proc/loadavg))"
    "$BENCH" --server "$RINGKV_ADDR" -c "$CONNECTIONS" -P "$P" -d "$VALUE_BYTES" \
      -r "$KEYS" -n "$N" --seed "$round" | tee "$WORK/ringkv.out"
    sed -n 's/^RESULT .*put_ops_per_sec=\([0-9]*\).*/\1/p' "$WORK/ringkv.out" >>"$WORK/${row}_ringkv_put"
    sed -n 's/^RESULT .*get_ops_per_sec=\([0-9]*\).*/\1/p' "$WORK/ringkv.out" >>"$WORK/${row}_ringkv_get"
    sed -n 's/^RESULT .*put_batch_p99_ms=\([0-9.]*\).*/\1/p' "$WORK/ringkv.out" >>"$WORK/${row}_ringkv_put_p99"
    sed -n 's/^RESULT .*get_batch_p99_ms=\([0-9.]*\).*/\1/p' "$WORK/ringkv.out" >>"$WORK/${row}_ringkv_get_p99"
  done
done

say "medians of $ROUNDS rounds (ops/s; p99 in ms: redis-benchmark's per command, ringkv-bench's per request)"
printf '%-10s %-4s %12s %12s %9s %22s %9s %9s\n' row op redis ringkv ratio "per-round ratios" "redis p99" "ringkv p99"
for row in $ROWS; do
  for op in put get; do
    r=$(median <"$WORK/${row}_redis_${op}")
    k=$(median <"$WORK/${row}_ringkv_${op}")
    rp=$(median <"$WORK/${row}_redis_${op}_p99")
    kp=$(median <"$WORK/${row}_ringkv_${op}_p99")
    per=$(paste "$WORK/${row}_ringkv_${op}" "$WORK/${row}_redis_${op}" | awk '{printf "%.2f ", $1/$2}')
    printf '%-10s %-4s %12.0f %12.0f %8.2fx %22s %9s %9s\n' "$row" "$op" "$r" "$k" \
      "$(awk -v a="$k" -v b="$r" 'BEGIN {print a/b}')" "$per" "$rp" "$kp"
  done
done
echo "RESULT_ROWS $(for row in $ROWS; do for op in put get; do printf '%s_%s_ratio=%s ' "$row" "$op" "$(awk -v a="$(median <"$WORK/${row}_ringkv_${op}")" -v b="$(median <"$WORK/${row}_redis_${op}")" 'BEGIN {printf "%.2f", a/b}')"; done; done)"

if [ "$RESP" = 1 ]; then
  . scripts/lib/bench-resp-rows.sh
  resp_rows "$ROUNDS"
fi
