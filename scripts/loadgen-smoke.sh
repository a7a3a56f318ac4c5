#!/usr/bin/env bash
# loadgen smoke run against the real `ringkv-server` binary (CI calls this).
#
# Builds ringkv-server and loadgen (debug), starts the server on a temporary
# data directory and a free loopback port, runs loadgen --server with tiny
# sizes for a few seconds per workload (put/get, YCSB, sweep), checks --json,
# `loadgen compare` and --plot, then stops the server with SIGTERM and checks
# that it exits cleanly. Any failure exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[loadgen-smoke] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

log "building ringkv-server and loadgen"
cargo build --quiet -p ringkv-server -p loadgen
target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/debug"
[ -x "$bin/ringkv-server" ] || fail "no $bin/ringkv-server"
[ -x "$bin/loadgen" ] || fail "no $bin/loadgen"

work=$(mktemp -d "${TMPDIR:-/tmp}/loadgen-smoke.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A free loopback port: ask the kernel (python3), else probe a range.
free_port() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
    return
  fi
  local p
  for p in $(seq 20000 20999); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
  fail "no free port found in 20000-20999"
}

port=$(free_port)
addr="127.0.0.1:$port"
log "starting ringkv-server on $addr (data in $work/data)"
"$bin/ringkv-server" --data-dir "$work/data" --listen "$addr" --durability sync \
  --device-profile nvme >"$work/server.log" 2>&1 &
server_pid=$!

# Wait (bounded) for the listener.
for _ in $(seq 1 300); do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    cat "$work/server.log" >&2
    fail "ringkv-server exited during start-up"
  fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    break
  fi
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || fail "ringkv-server did not listen on $addr within 30 s"

tiny=(--threads 4 --batch 100 --records 2K --warmup 0.5 --duration 1 --timeout 30)

log "put/get (two runs for compare, one with --plot)"
"$bin/loadgen" --server "$addr" "${tiny[@]}" --json "$work/a.json" --plot "$work/a.svg" >"$work/a.txt"
"$bin/loadgen" --server "$addr" "${tiny[@]}" --seed 2 --json "$work/b.json" >"$work/b.txt"
cat "$work/a.txt"
grep -q "Throughput, 1000 ops/s" "$work/a.txt" || fail "no GridGain-style table in the output"
grep -q '"schema": "ringkv-loadgen/1"' "$work/a.json" || fail "JSON lacks the schema"
head -c 4 "$work/a.svg" | grep -q "<svg" || fail "--plot did not write an SVG"

log "compare"
"$bin/loadgen" compare "$work/a.json" "$work/b.json" >"$work/compare.txt"
cat "$work/compare.txt"
grep -q "delta" "$work/compare.txt" || fail "compare printed no delta rows"

log "YCSB A-F"
"$bin/loadgen" --server "$addr" --workload ycsb --threads 4 --batch 100 --records 2K \
  --warmup 0.2 --duration 0.5 --timeout 30 >"$work/ycsb.txt"
cat "$work/ycsb.txt"
grep -q "ycsb-f" "$work/ycsb.txt" || fail "YCSB F missing from the report"

log "sweep"
"$bin/loadgen" --server "$addr" --workload sweep --sweep-sizes 1K,5K --threads 4 --batch 100 \
  --timeout 30 >"$work/sweep.txt"
cat "$work/sweep.txt"
grep -q "Storage(R/W)" "$work/sweep.txt" || fail "no sweep table"

log "PutGetTx (contended: aborts and lock waits show)"
"$bin/loadgen" --server "$addr" --workload putgettx-contended --threads 8 \
  --warmup 0.2 --duration 0.5 --timeout 30 >"$work/putgettx.txt"
cat "$work/putgettx.txt"
grep -q "published, 4 servers" "$work/putgettx.txt" || fail "no published PutGetTx rows"
grep -q "ringkv putgettx-contended" "$work/putgettx.txt" || fail "no PutGetTx row of ours"

log "hybrid tier: a sweep over ~10x its read cache, every value read back checked"
"$bin/loadgen" --workload sweep --tier hybrid --target server --device unthrottled \
  --sweep-sizes 50K --cache-bytes 256KiB --threads 4 --batch 100 --timeout 60 >"$work/hybrid.txt"
cat "$work/hybrid.txt"
grep -q "tier hybrid" "$work/hybrid.txt" || fail "the hybrid run does not report its tier"
grep -q "Storage(R/W)" "$work/hybrid.txt" || fail "no hybrid sweep table"
if grep -q "ERRORS:" "$work/hybrid.txt"; then fail "the hybrid tier gave wrong or failed answers"; fi

log "stopping ringkv-server (SIGTERM)"
kill -TERM "$server_pid"
for _ in $(seq 1 300); do
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$server_pid" 2>/dev/null; then
  cat "$work/server.log" >&2
  fail "ringkv-server did not exit within 30 s of SIGTERM"
fi
status=0
wait "$server_pid" || status=$?
server_pid=""
[ "$status" -eq 0 ] || { cat "$work/server.log" >&2; fail "ringkv-server exited with status $status"; }
log "OK"
