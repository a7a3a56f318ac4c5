#!/usr/bin/env bash
# What TLS (and the password) cost: loadgen's put/get main job, batched (1,000
# per request) and unbatched (1 per request), against a release ringkv-server
# without and with TLS + password, one after the other in the same run.
#
# Each case starts a fresh server (loopback, temp data directory, removed at
# the end) and runs `loadgen --server ADDR` with the main job's defaults
# (200K records of 10 x 100 B, 16 client tasks, 2 s warm-up, 10 s measured
# per phase). The TLS server uses a P-256 certificate made with openssl and a
# password file; loadgen connects with --ca and RINGKV_PASSWORD.
#
# After each case it also prints the server's CPU time (user + system, from
# /proc) divided by the operations it served (STATS ops.put + ops.get +
# ops.delete): CPU per operation is far less sensitive to other load on a
# shared machine than throughput is.
#
# Usage: scripts/bench-tls.sh [DURABILITIES="none sync"] [BATCHES="1000 1"]
# Prints every loadgen table; JSON reports go to $OUT (default: a temp dir).
set -euo pipefail
cd "$(dirname "$0")/.."

DURABILITIES="${1:-none sync}"
BATCHES="${2:-1000 1}"
say() { printf '\n=== %s\n' "$*"; }

command -v openssl >/dev/null || { echo "openssl is needed (apt-get install -y openssl)"; exit 1; }
say "building (release)"
cargo build --release -q -p ringkv-server -p loadgen -p ringkv-client
SERVER=target/release/ringkv-server
LOADGEN=target/release/loadgen
CLI=target/release/ringkv
TICKS=$(getconf CLK_TCK)

WORK="$(mktemp -d -t ringkv-bench-tls.XXXXXX)"
OUT="${OUT:-$WORK}"
PID=""
cleanup() {
  set +e
  if [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null; then
    kill -TERM "$PID"; wait "$PID" 2>/dev/null
  fi
  rm -rf "$WORK/data" "$WORK"/*.key "$WORK"/*.log
}
trap cleanup EXIT

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
  -addext "basicConstraints=critical,CA:FALSE" \
  -keyout "$WORK/server.key" -out "$WORK/server.pem" 2>/dev/null
head -c 24 /dev/urandom | base64 >"$WORK/password"

CASE=0
start() { # $1 durability, $2 plain|tls
  rm -rf "$WORK/data"
  CASE=$((CASE + 1))
  : >"$WORK/server-$CASE.log" # exists before the loop below reads it
  local extra=()
  [ "$2" = tls ] && extra=(--password-file "$WORK/password" --tls-cert "$WORK/server.pem" --tls-key "$WORK/server.key")
  "$SERVER" --data-dir "$WORK/data" --listen 127.0.0.1:0 --durability "$1" "${extra[@]}" \
    >"$WORK/server-$CASE.log" 2>&1 &
  PID=$!
  ADDR=""
  for _ in $(seq 1 300); do
    ADDR=$(sed -n 's/.*ringkv-server ready.* addr=\([0-9.:]*\).*/\1/p' "$WORK/server-$CASE.log" | head -1)
    [ -n "$ADDR" ] && return
    sleep 0.1
  done
  cat "$WORK/server-$CASE.log"; exit 1
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$PID/stat"; }
stop() { kill -TERM "$PID"; wait "$PID" || true; PID=""; }

for durability in $DURABILITIES; do
  for batch in $BATCHES; do
    for mode in plain tls; do
      say "durability $durability, batch $batch, $mode"
      start "$durability" "$mode"
      flags=()
      if [ "$mode" = tls ]; then
        flags=(--ca "$WORK/server.pem")
        export RINGKV_PASSWORD
        RINGKV_PASSWORD="$(cat "$WORK/password")"
      else
        unset RINGKV_PASSWORD
      fi
      before=$(cpu_ticks)
      "$LOADGEN" --server "$ADDR" --batch "$batch" "${flags[@]}" \
        --json "$OUT/$durability-b$batch-$mode.json"
      after=$(cpu_ticks)
      ops=$("$CLI" --server "$ADDR" "${flags[@]}" stats |
        awk '$1 == "ops.put" || $1 == "ops.get" || $1 == "ops.delete" { n += $2 } END { print n }')
      awk -v t=$((after - before)) -v hz="$TICKS" -v n="$ops" -v d="$durability" -v b="$batch" -v m="$mode" \
        'BEGIN { printf "server CPU: durability %s batch %s %s: %.2f s for %d ops = %.3f us/op\n", d, b, m, t / hz, n, t / hz * 1e6 / n }'
      stop
    done
  done
done
say "JSON reports in $OUT"
