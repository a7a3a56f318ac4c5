#!/usr/bin/env bash
# docs/benchmarks.md, "Durable write path (issue 29): the issue's rows, before
# and after" (rows 1 and 2). Two builds side by side, A/B alternating inside
# every round, medians over ROUNDS rounds:
#
#   server  (row 1) Redis 7 (`--appendonly yes --appendfsync always`) and
#           ringkv-server (`--durability sync`, 2 shards, device
#           `unthrottled`, memory tier), one fresh server per arm and round:
#             redis-benchmark -t set -d 1000 -c 50 -r KEYS -P 1 / -P 16
#               (both servers; ringkv on its RESP port);
#             ringkv-bench -P 1 -d 1000 with 1, 16 and 64 connections
#               (ringkv's native port; its PUT phase is what is reported);
#           beside each: the server's CPU per request (utime+stime of the
#           whole process from /proc/PID/stat over the run, / requests).
#           Each round first measures this disk's fdatasync latency with fio
#           (4 KiB writes, one fdatasync each, the same file system).
#   engine  (row 2) fio's sequential O_DIRECT bandwidth (1 MiB writes, one
#           fdatasync each, one job per shard, overwriting preallocated
#           files: the WAL's pattern), then the engine bench put_sync of each
#           arm (durable 1 KB puts, batches of 1,000, 16 submitters, 2
#           shards; it measures its own raw bandwidth before and after its
#           puts), then fio again.
#
# Arms: "before" = BEFORE_DIR's binaries (no wal_flushes_in_flight setting),
# "after-k1" and "after-k4" = AFTER_DIR's with storage.wal_flushes_in_flight
# 1 and 4. One client binary (AFTER_DIR's ringkv-bench) for every arm.
#
# Usage: scripts/bench-durable-writes.sh [server|engine|perf|summary|all] [ROUNDS=3]
#        (summary: only the medians of the rows already in OUT)
# Env:   BEFORE_DIR, AFTER_DIR (ringkv-server, ringkv-bench, put_sync in each),
#        N_P1 (200000), N_P16 (800000), KEYS (100000), NATIVE ("1:2000
#        16:60000 64:120000", connections:PUTs), ENGINE_SECONDS (10),
#        PERF=1 (after the rounds: perf record -g on the after-k1 server
#        during one P=1 and one native 16-connection run), OUT (results dir)
# Benchmark processes run at the caller's priority (run it at nice 0).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-common.sh

MODE="${1:-all}"
ROUNDS="${2:-3}"
FIRST_ROUND="${FIRST_ROUND:-1}"   # number of the first round (to add rounds to an OUT)
BEFORE_DIR="${BEFORE_DIR:?set BEFORE_DIR to the before build's binaries}"
AFTER_DIR="${AFTER_DIR:?set AFTER_DIR to the after build's binaries}"
N_P1="${N_P1:-200000}"
N_P16="${N_P16:-800000}"
KEYS="${KEYS:-100000}"
NATIVE="${NATIVE:-1:2000 16:60000 64:120000}"
ENGINE_SECONDS="${ENGINE_SECONDS:-10}"
ARMS="${ARMS:-before after-k1 after-k4}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/bench-durable-writes.XXXXXX")}"
mkdir -p "$OUT"
TCK=$(getconf CLK_TCK)
BENCH="$AFTER_DIR/ringkv-bench"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
arm_dir() { case $1 in before) echo "$BEFORE_DIR" ;; *) echo "$AFTER_DIR" ;; esac; }
arm_k() { case $1 in after-k*) echo "${1#after-k}" ;; *) echo "" ;; esac; }

# start_arm ARM: a fresh ringkv-server of that arm; sets RINGKV_PID,
# RINGKV_ADDR, RINGKV_RESP_PORT (start_ringkv of bench-common.sh).
start_arm() {
  local arm="$1" k cfg=()
  SERVER="$(arm_dir "$arm")/ringkv-server"
  rm -rf "$WORK/ringkv"
  k=$(arm_k "$arm")
  if [ -n "$k" ]; then
    printf '[storage]\nwal_flushes_in_flight = %s\n' "$k" >"$WORK/arm.toml"
    cfg=(--config "$WORK/arm.toml")
  fi
  start_ringkv "${cfg[@]}" --shards 2 --device-profile unthrottled
}
stop_arm() { stop_pid "$RINGKV_PID"; RINGKV_PID=""; rm -rf "$WORK/ringkv"; }

# rb NAME PORT PID P N: redis-benchmark SET row; appends
# "round name P ops/s p50_ms p99_ms cpu_us_per_req load1" to $OUT/resp.
rb() {
  local name="$1" port="$2" pid="$3" p="$4" n="$5" c0 c1 csv
  c0=$(cpu_ticks "$pid")
  csv=$(redis-benchmark -h 127.0.0.1 -p "$port" -t set -d 1000 -c 50 -r "$KEYS" -P "$p" -n "$n" --csv 2>/dev/null)
  c1=$(cpu_ticks "$pid")
  printf '%s\n' "$csv" | awk -F'"' -v r="$ROUND" -v name="$name" -v p="$p" -v n="$n" -v tck="$TCK" \
    -v dc=$((c1 - c0)) -v l="$(cut -d' ' -f1 /proc/loadavg)" \
    '$2 == "SET" {printf "%s %s P=%s %.0f %s %s %.2f %s\n", r, name, p, $4, $10, $14, dc * 1e6 / tck / n, l}' |
    tee -a "$OUT/resp"
}

# native NAME C N: ringkv-bench PUT phase; CPU sampled when the PUT line
# appears (ringkv-bench flushes each phase's line). Appends
# "round name c=C put/s p50_ms p99_ms cpu_us_per_put load1" to $OUT/native.
native() {
  local name="$1" c="$2" n="$3" c0 c1="" f="$WORK/native.out" bpid line
  # The file is removed first: the loop below must not find the PUT line of
  # the previous run before the new run's redirection truncates the file.
  rm -f "$f"
  c0=$(cpu_ticks "$RINGKV_PID")
  "$BENCH" --server "$RINGKV_ADDR" -c "$c" -P 1 -d 1000 -r 1000000 -n "$n" --seed "${ROUND//[!0-9]/}" >"$f" 2>&1 &
  bpid=$!
  while kill -0 "$bpid" 2>/dev/null; do
    if grep -q '^PUT:' "$f" 2>/dev/null; then c1=$(cpu_ticks "$RINGKV_PID"); break; fi
    sleep 0.02
  done
  wait "$bpid" || { cat "$f"; exit 1; }
  [ -n "$c1" ] || c1=$(cpu_ticks "$RINGKV_PID")
  line=$(grep '^PUT:' "$f")
  # PUT: N ops in S s = X ops/s; batch latency ms p50 A p95 B p99 C ...
  printf '%s\n' "$line" | awk -v r="$ROUND" -v name="$name" -v c="$c" -v n="$n" -v tck="$TCK" \
    -v dc=$((c1 - c0)) -v l="$(cut -d' ' -f1 /proc/loadavg)" \
    '{for (i = 1; i <= NF; i++) {if ($i == "=") ops = $(i + 1); if ($i == "p50") p50 = $(i + 1); if ($i == "p99") p99 = $(i + 1)}
      printf "%s %s c=%s %.0f %s %s %.2f %s\n", r, name, c, ops, p50, p99, dc * 1e6 / tck / n, l}' |
    tee -a "$OUT/native"
}

# fio_fsync: this disk's fdatasync latency (4 KiB writes, one fdatasync each).
# Appends "round p50_us p99_us iops load1" to $OUT/fsync.
fio_fsync() {
  mkdir -p "$WORK/fio"
  fio --name=fsync --rw=write --bs=4k --size=64m --fdatasync=1 --ioengine=sync \
    --runtime=8 --time_based --directory="$WORK/fio" --output-format=json >"$WORK/fio.json"
  python3 - "$WORK/fio.json" "$ROUND" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF' | tee -a "$OUT/fsync"
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
pct = j["sync"]["lat_ns"]["percentile"]
print(sys.argv[2], round(pct["50.000000"] / 1000), round(pct["99.000000"] / 1000),
      round(j["write"]["iops"]), sys.argv[3])
EOF
  rm -rf "$WORK/fio"
}

# fio_raw WHEN: sequential O_DIRECT, 1 MiB writes + fdatasync, 2 jobs over
# preallocated 256 MiB files (laid out before the timed part). Appends
# "round when MB/s load1" to $OUT/fio_raw.
fio_raw() {
  mkdir -p "$WORK/fioraw"
  fio --name=raw --rw=write --bs=1m --direct=1 --ioengine=psync --fdatasync=1 --numjobs=2 \
    --size=256m --runtime=4 --time_based --group_reporting --directory="$WORK/fioraw" \
    --output-format=json >"$WORK/fioraw.json"
  python3 - "$WORK/fioraw.json" "$ROUND" "$1" "$(cut -d' ' -f1 /proc/loadavg)" <<'EOF' | tee -a "$OUT/fio_raw"
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print(sys.argv[2], sys.argv[3], round(j["write"]["bw_bytes"] / 1e6), sys.argv[4])
EOF
  rm -rf "$WORK/fioraw"
}

# engine ARM: put_sync of that arm. Appends "round arm puts/s wal_MB/s
# wal_pct_of_own_raw own_raw_MB/s load1" to $OUT/engine.
engine() {
  local arm="$1" k args=() f="$WORK/put_sync.out"
  k=$(arm_k "$arm")
  [ -n "$k" ] && args=(--wal-flushes-in-flight "$k")
  "$(arm_dir "$arm")/put_sync" --seconds "$ENGINE_SECONDS" --memory-keys 0 --key-space 100000 \
    --shards 2 --dir "$WORK/put_sync" "${args[@]}" >"$f" 2>&1 || { cat "$f"; exit 1; }
  cp "$f" "$OUT/put_sync-r$ROUND-$arm.txt"
  rm -rf "$WORK/put_sync"
  awk -v r="$ROUND" -v arm="$arm" -v l="$(cut -d' ' -f1 /proc/loadavg)" '
    /^raw O_DIRECT/ {raw += $6; nraw++}
    /^durable puts:/ {split($3, a, "/"); puts = a[1]}
    /^WAL:/ {wal = $2; for (i = 1; i <= NF; i++) if ($i ~ /%$/) pct = $i}
    END {printf "%s %s %s %s %s %.0f %s\n", r, arm, puts, wal, pct, raw / (nraw ? nraw : 1), l}' "$f" |
    tee -a "$OUT/engine"
}

say "machine"
machine_line
echo "before: $BEFORE_DIR ($("$BEFORE_DIR/ringkv-server" --version))"
echo "after:  $AFTER_DIR ($("$AFTER_DIR/ringkv-server" --version))"
echo "mode $MODE, $ROUNDS rounds, arms: $ARMS"

if [ "$MODE" = server ] || [ "$MODE" = all ]; then
  ensure_redis
  echo "redis: $(redis-server --version)"
  for ROUND in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
    say "round $ROUND (server rows), load $(load)"
    fio_fsync
    # Redis gets a fresh server each round too (its AOF grows with every run).
    rm -rf "$WORK/redis"
    start_redis
    for p in 1 16; do
      if [ "$p" = 1 ]; then n=$N_P1; else n=$N_P16; fi
      rb redis "$REDIS_PORT" "$REDIS_PID" "$p" "$n"
    done
    stop_pid "$REDIS_PID"; REDIS_PID=""
    # Arm order turns each round so no arm always runs first.
    arms=($ARMS)
    shift_by=$(((ROUND - 1) % ${#arms[@]}))
    arms=("${arms[@]:$shift_by}" "${arms[@]:0:$shift_by}")
    for arm in "${arms[@]}"; do
      start_arm "$arm"
      for p in 1 16; do
        if [ "$p" = 1 ]; then n=$N_P1; else n=$N_P16; fi
        rb "$arm" "$RINGKV_RESP_PORT" "$RINGKV_PID" "$p" "$n"
      done
      for cn in $NATIVE; do native "$arm" "${cn%%:*}" "${cn##*:}"; done
      stop_arm
    done
  done
fi
if { [ "$MODE" = all ] && [ "${PERF:-0}" = 1 ]; } || [ "$MODE" = perf ]; then
  ROUND=9
  say "perf: after-k1 server, one P=1 redis-benchmark run and one native 16-connection run"
  start_arm after-k1
  perf record -g -o "$OUT/perf-p1.data" -p "$RINGKV_PID" >/dev/null 2>&1 &
  ppid=$!; sleep 0.5
  rb after-k1-perf "$RINGKV_RESP_PORT" "$RINGKV_PID" 1 "$N_P1"
  kill -INT "$ppid"; wait "$ppid" || true
  perf record -g -o "$OUT/perf-native16.data" -p "$RINGKV_PID" >/dev/null 2>&1 &
  ppid=$!; sleep 0.5
  native after-k1-perf 16 "$(printf '%s\n' $NATIVE | sed -n 's/^16://p')"
  kill -INT "$ppid"; wait "$ppid" || true
  stop_arm
  for d in p1 native16; do
    perf report -i "$OUT/perf-$d.data" --no-children --stdio 2>/dev/null | grep -v '^$' | head -60 >"$OUT/perf-$d.txt"
  done

fi

if [ "$MODE" = engine ] || [ "$MODE" = all ]; then
  for ROUND in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
    say "round $ROUND (engine rows), load $(load)"
    fio_raw before
    arms=($ARMS)
    shift_by=$(((ROUND - 1) % ${#arms[@]}))
    arms=("${arms[@]:$shift_by}" "${arms[@]:0:$shift_by}")
    for arm in "${arms[@]}"; do engine "$arm"; done
    fio_raw after
  done
fi

say "medians of the rounds in $OUT"
med() { median; }
if [ -s "$OUT/fsync" ]; then
  echo "fio fdatasync (4 KiB): p50 $(awk '{print $2}' "$OUT/fsync" | med) us, p99 $(awk '{print $3}' "$OUT/fsync" | med) us (runs: $(awk '{printf "%s/%s ", $2, $3}' "$OUT/fsync"))"
fi
# One table of medians: rows of FILE are "round arm key ops p50 p99 cpu";
# one line per arm (ARMS_OF) and key (KEYS); CPU_KEEP filters the CPU
# samples (a CPU of 0.00 is a sample taken at the wrong moment, see
# native(), and is left out).
medians_table() {
  local file=$1 head=$2 arms=$3 keys=$4 cpu_keep=$5 name key
  printf '%-9s %-5s %10s %8s %8s %9s  %s\n' server $head p50_ms p99_ms cpu_us runs
  for name in $arms; do
    for key in $keys; do
      sel() { awk -v n="$name" -v k="$key" -v col="$1" '$2 == n && $3 == k {print $col}' "$file"; }
      [ -n "$(sel 4)" ] || continue
      printf '%-9s %-5s %10.0f %8s %8s %9s  %s\n' "$name" "$key" "$(sel 4 | med)" "$(sel 5 | med)" \
        "$(sel 6 | med)" "$(sel 7 | awk "$cpu_keep" | med)" "$(sel 4 | tr '\n' ' ')"
    done
  done
}
if [ -s "$OUT/resp" ]; then
  medians_table "$OUT/resp" "P ops/s" "redis $ARMS" "P=1 P=16" 1
fi
if [ -s "$OUT/native" ]; then
  conns=$(for cn in $NATIVE; do printf 'c=%s ' "${cn%%:*}"; done)
  medians_table "$OUT/native" "conns put/s" "$ARMS" "$conns" '$1 > 0'
fi
if [ -s "$OUT/engine" ]; then
  fio_med=$(awk '{print $3}' "$OUT/fio_raw" | med)
  echo "fio raw O_DIRECT MB/s: median $fio_med (runs: $(awk '{printf "%s ", $3}' "$OUT/fio_raw"))"
  printf '%-9s %10s %8s %8s %10s  %s\n' arm puts/s WAL_MB/s WAL/own wal/fio runs
  for name in $ARMS; do
    sel() { awk -v n="$name" -v col="$1" '$2 == n {print $col}' "$OUT/engine"; }
    [ -n "$(sel 3)" ] || continue
    # WAL / fio per round: that round's WAL MB/s over the mean of its two fio runs.
    ratios=$(awk -v n="$name" 'FNR == NR {s[$1] += $3; c[$1]++; next} $2 == n {printf "%.2f\n", $4 / (s[$1] / c[$1])}' \
      "$OUT/fio_raw" "$OUT/engine")
    printf '%-9s %10.0f %8.0f %8s %10s  %s\n' "$name" "$(sel 3 | med)" "$(sel 4 | med)" \
      "$(sel 5 | tr -d % | med)%" "$(printf '%s\n' "$ratios" | med)" "$(sel 3 | tr '\n' ' ')"
  done
fi
echo "raw rows in $OUT"
