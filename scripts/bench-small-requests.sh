#!/usr/bin/env bash
# Small requests, one client, two servers: redis-benchmark at its defaults
# (50 connections, here with -d 1000 and a key space of 100,000) against
# Redis 7 (`--appendonly yes --appendfsync always`) and against ringkv's
# RESP listener (`--durability sync`), SET and GET at pipeline depth 1 and
# 16, ROUNDS interleaved rounds (each round: Redis, then ringkv, row by
# row). Beside throughput it prints what the server spent per request:
#
#   cpu/op  the server process's utime+stime (/proc/PID/stat, all threads)
#           over the run, divided by the requests of the run, in µs;
#   cs/op   voluntary + involuntary context switches of all the server's
#           threads (/proc/PID/task/*/status) over the run, per request.
#
# On a 2-core machine shared by client and server, throughput at depth 1
# mostly measures the client; CPU and context switches per request are
# what the server itself costs. The last table gives medians and the
# ringkv/Redis ratio of each (cpu ratio < 1: ringkv spends less).
#
# A third server runs beside them, ringkv with one shard (`--shards 1`),
# measured in the same rounds: "ringkv" against "ringkv1" is what the hop
# between two shards costs (the hop ratio: cpu/op at two shards over cpu/op
# at one). With --metrics-listen the two-shard server's wake-ups per
# cross-shard request (ringkv_shard_wakeups_total over
# ringkv_shard_cross_requests_total) are printed per row too.
#
# Then PutGetTx (loadgen --workload putgettx --durability sync --threads
# 64, embedded server, 2 shards) on the nvme and unthrottled profiles, ROUNDS
# runs of 5 s each, and their medians (PUTGETTX=0 leaves it out).
#
# Usage: scripts/bench-small-requests.sh [ROUNDS=3]
# Env:   N_P1 (200000), N_P16 (1000000), CLIENTS (50), RINGKV_SHARDS (0 =
#        one per core; the one-shard server always has 1), BIN_DIR (ringkv-server from there instead of a
#        fresh release build), RINGKV_ARGS (more server flags),
#        ROWS ("1:set 1:get 16:set 16:get")
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-common.sh

ROUNDS="${1:-3}"
N_P1="${N_P1:-200000}"
N_P16="${N_P16:-1000000}"
CLIENTS="${CLIENTS:-50}"
RINGKV_SHARDS="${RINGKV_SHARDS:-0}"
ROWS="${ROWS:-1:set 1:get 16:set 16:get}"
TCK=$(getconf CLK_TCK)

setup_both
# shellcheck disable=SC2086
RINGKV_NAME=ringkv1 start_ringkv --shards 1 ${RINGKV_ARGS:-}
ONE_PID=$RINGKV_PID ONE_PORT=$RINGKV_RESP_PORT
EXTRA_PIDS="$ONE_PID"
# shellcheck disable=SC2086
start_ringkv --shards "$RINGKV_SHARDS" --metrics-listen 127.0.0.1:0 ${RINGKV_ARGS:-}
METRICS_ADDR=$(grep "ringkv-server ready" "$WORK/ringkv.log" | head -1 | sed -n 's/.* metrics=\([0-9.]*:[0-9]*\).*/\1/p')

# cpu_ticks PID: utime+stime of the whole process, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# ctx_switches PID: voluntary + involuntary switches of every thread.
ctx_switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null |
    awk '/^(voluntary|nonvoluntary)_ctxt_switches/ {s += $2} END {print s + 0}'
}

# metric NAME: the two-shard server's counter NAME summed over its labels
# (0 without a metrics address or without the counter).
metric() {
  [ -n "${METRICS_ADDR:-}" ] || { echo 0; return; }
  curl -s "http://$METRICS_ADDR/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}'
}

# run_row NAME PORT PID P OP N -> one line: name P op rps cpu_us_per_op
# cs_per_op wakeups_per_cross_request (the last for "ringkv" only)
run_row() {
  local name="$1" port="$2" pid="$3" p="$4" op="$5" n="$6" c0 c1 s0 s1 w0 w1 x0 x1 out rps
  w0=0 w1=0 x0=0 x1=0
  if [ "$name" = ringkv ]; then w0=$(metric ringkv_shard_wakeups_total); x0=$(metric ringkv_shard_cross_requests_total); fi
  c0=$(cpu_ticks "$pid"); s0=$(ctx_switches "$pid")
  out=$(redis-benchmark -h 127.0.0.1 -p "$port" -t "$op" -d 1000 -c "$CLIENTS" -r 100000 \
    -P "$p" -n "$n" -q 2>&1 | tr '\r' '\n')
  c1=$(cpu_ticks "$pid"); s1=$(ctx_switches "$pid")
  if [ "$name" = ringkv ]; then w1=$(metric ringkv_shard_wakeups_total); x1=$(metric ringkv_shard_cross_requests_total); fi
  rps=$(printf '%s\n' "$out" | sed -n 's/^[A-Z]*: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
  awk -v name="$name" -v p="$p" -v op="$op" -v rps="${rps:-0}" -v n="$n" -v tck="$TCK" \
    -v dc=$((c1 - c0)) -v ds=$((s1 - s0)) -v dw="$(awk -v a="$w0" -v b="$w1" 'BEGIN {print b - a}')" \
    -v dx="$(awk -v a="$x0" -v b="$x1" 'BEGIN {print b - a}')" \
    'BEGIN {printf "%-7s P=%-3s %-4s %10.0f %9.2f %7.3f %7.3f\n", name, p, op, rps, dc * 1e6 / tck / n, ds / n, (dx > 0 ? dw / dx : 0)}'
}

say "redis-benchmark -c $CLIENTS -d 1000 -r 100000, N = $N_P1 (P=1) / $N_P16 (P=16); each row: ops/s, server cpu µs/op, server context switches/op"
# Fill the key space first so GETs find values on both servers.
redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -t set -d 1000 -c "$CLIENTS" -r 100000 -P 16 -n 400000 -q >/dev/null 2>&1
redis-benchmark -h 127.0.0.1 -p "$RINGKV_RESP_PORT" -t set -d 1000 -c "$CLIENTS" -r 100000 -P 16 -n 400000 -q >/dev/null 2>&1
redis-benchmark -h 127.0.0.1 -p "$ONE_PORT" -t set -d 1000 -c "$CLIENTS" -r 100000 -P 16 -n 400000 -q >/dev/null 2>&1
printf '%-7s %-5s %-4s %10s %9s %7s %7s\n' server P op ops/s cpu_us cs/op wake/x
for round in $(seq "$ROUNDS"); do
  echo "-- round $round"
  for row in $ROWS; do
    p=${row%%:*}; op=${row##*:}
    if [ "$p" = 1 ]; then n=$N_P1; else n=$N_P16; fi
    run_row redis "$REDIS_PORT" "$REDIS_PID" "$p" "$op" "$n" | tee -a "$WORK/rows"
    run_row ringkv "$RINGKV_RESP_PORT" "$RINGKV_PID" "$p" "$op" "$n" | tee -a "$WORK/rows"
    run_row ringkv1 "$ONE_PORT" "$ONE_PID" "$p" "$op" "$n" | tee -a "$WORK/rows"
  done
done

say "medians of $ROUNDS rounds (ratio = ringkv / redis; hop = ringkv cpu / ringkv1 cpu; wake/x = wake-ups per cross-shard request)"
printf '%-5s %-4s %10s %10s %7s %9s %9s %7s %9s %6s %8s %8s %7s %7s\n' P op redis_ops ringkv_ops ratio \
  redis_cpu ringkv_cpu ratio ringkv1_cpu hop redis_cs ringkv_cs ratio wake/x
for row in $ROWS; do
  p=${row%%:*}; op=${row##*:}
  med() { awk -v s="$1" -v p="P=$p" -v op="$op" -v col="$2" '$1 == s && $2 == p && $3 == op {print $col}' "$WORK/rows" | median; }
  rr=$(med redis 4); kr=$(med ringkv 4); rc=$(med redis 5); kc=$(med ringkv 5); rs=$(med redis 6); ks=$(med ringkv 6)
  oc=$(med ringkv1 5); kw=$(med ringkv 7)
  awk -v p="$p" -v op="$op" -v rr="$rr" -v kr="$kr" -v rc="$rc" -v kc="$kc" -v rs="$rs" -v ks="$ks" -v oc="$oc" -v kw="$kw" \
    'function r(a, b) {return b > 0 ? a / b : 0}
     BEGIN {printf "%-5s %-4s %10.0f %10.0f %7.2f %9.2f %9.2f %7.2f %9.2f %6.2f %8.3f %8.3f %7.2f %7.3f\n", "P=" p, op, rr, kr, r(kr, rr), rc, kc, r(kc, rc), oc, r(kc, oc), rs, ks, r(ks, rs), kw}'
done

if [ "${PUTGETTX:-1}" = 1 ]; then
  say "PutGetTx: loadgen --workload putgettx --durability sync --threads 64 --duration 5 --warmup 1, tx/s"
  for round in $(seq "$ROUNDS"); do
    for device in nvme unthrottled; do
      tx=$("$LOADGEN" --workload putgettx --durability sync --threads 64 --device "$device" \
        --duration 5 --warmup 1 2>&1 | awk '/^ringkv putgettx/ {gsub(",", "", $6); print $6}')
      echo "putgettx $device ${tx:-0}" | tee -a "$WORK/tx"
    done
  done
  for device in nvme unthrottled; do
    echo "median $device: $(awk -v d="$device" '$2 == d {print $3}' "$WORK/tx" | median) tx/s"
  done
fi
