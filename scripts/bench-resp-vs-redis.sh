#!/usr/bin/env bash
# One client, two servers: redis-benchmark against ringkv's RESP listener
# (`--durability sync`: a write is acknowledged after the fdatasync that
# covers it) and against Redis 7 (`--appendonly yes --appendfsync always`:
# fsync before every acknowledgement), in the same run, on loopback.
#
#   redis-benchmark -t set,get -d 1000 -c 16 -r 100000 -P P -n N
#   for P in 1 16 1000 (N = N_P1, N_P16, N_P1000), ROUNDS rounds,
#   each round: Redis, then ringkv.
#
# Both servers listen on 127.0.0.1 on ports the kernel picks (ringkv:
# --resp-listen 127.0.0.1:0, read from its ready line; Redis: a port the
# kernel handed out to a throw-away socket, since Redis's port 0 means "no
# TCP"). Redis's appendfsync is checked with CONFIG GET before measuring.
# Both run in a temp dir that is removed at the end.
#
# Usage: scripts/bench-resp-vs-redis.sh [ROUNDS=3]
# Env:   N_P1 (20000), N_P16 (100000), N_P1000 (400000), RINGKV_SHARDS (0)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${1:-3}"
N_P1="${N_P1:-20000}"
N_P16="${N_P16:-100000}"
N_P1000="${N_P1000:-400000}"
RINGKV_SHARDS="${RINGKV_SHARDS:-0}"

say() { printf '\n=== %s\n' "$*"; }

if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
  say "installing redis-server and redis-tools"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
fi

cargo build --release --quiet -p ringkv-server
target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/release/ringkv-server"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench-resp.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

say "machine"
echo "cpus: $(nproc); kernel: $(uname -r); load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "redis: $(redis-server --version)"
echo "ringkv: $("$bin" --version)"

mkdir -p "$WORK/redis"
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" --save '' \
  --appendonly yes --appendfsync always --daemonize no >"$WORK/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
  redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
  sleep 0.1
done
fsync=$(redis-cli -p "$REDIS_PORT" CONFIG GET appendfsync | tail -n 1)
[ "$fsync" = "always" ] || { echo "Redis appendfsync is '$fsync', not 'always'"; exit 1; }
echo "redis on 127.0.0.1:$REDIS_PORT, CONFIG GET appendfsync = $fsync"

"$bin" --data-dir "$WORK/ringkv" --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 \
  --durability sync --shards "$RINGKV_SHARDS" >"$WORK/ringkv.log" 2>&1 &
pids+=($!)
RINGKV_PORT=""
for _ in $(seq 1 300); do
  RINGKV_PORT=$(sed -n 's/.*ringkv-server ready.* resp=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$WORK/ringkv.log")
  [ -n "$RINGKV_PORT" ] && break
  sleep 0.1
done
[ -n "$RINGKV_PORT" ] || { cat "$WORK/ringkv.log"; exit 1; }
echo "ringkv on 127.0.0.1:$RINGKV_PORT, CONFIG GET appendfsync = $(redis-cli -p "$RINGKV_PORT" CONFIG GET appendfsync | tail -n 1)"

# bench PORT P N -> "set_rps get_rps"
bench() {
  local out
  out=$(redis-benchmark -h 127.0.0.1 -p "$1" -t set,get -d 1000 -c 16 -r 100000 -P "$2" -n "$3" -q 2>&1 | tr '\r' '\n')
  local set get
  set=$(printf '%s\n' "$out" | sed -n 's/^SET: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
  get=$(printf '%s\n' "$out" | sed -n 's/^GET: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
  echo "${set:-0} ${get:-0}"
}

say "redis-benchmark -t set,get -d 1000 -c 16 -r 100000 (requests per second)"
printf '%-6s %-6s %-8s %14s %14s\n' round P server SET GET
for round in $(seq 1 "$ROUNDS"); do
  for P in 1 16 1000; do
    case $P in 1) n=$N_P1 ;; 16) n=$N_P16 ;; *) n=$N_P1000 ;; esac
    read -r rs rg < <(bench "$REDIS_PORT" "$P" "$n")
    printf '%-6s %-6s %-8s %14s %14s\n' "$round" "$P" redis "$rs" "$rg"
    read -r ks kg < <(bench "$RINGKV_PORT" "$P" "$n")
    printf '%-6s %-6s %-8s %14s %14s\n' "$round" "$P" ringkv "$ks" "$kg"
  done
done
