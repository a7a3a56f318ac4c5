# Shared by scripts/bench-vs-redis.sh and scripts/bench-resp-vs-redis.sh:
# starting Redis 7 (AOF, appendfsync always) and ringkv-server (durability
# sync) on loopback ports the kernel picks, checking that what answers is
# what was started, stopping both on exit, and medians. Source it after
# `set -euo pipefail`; it sets WORK (a temp dir removed on exit).
#
# Ports: ringkv-server listens on port 0 (--listen/--resp-listen
# 127.0.0.1:0) and the port is read from its "ready" line. Redis cannot take
# port 0, so a free port is taken from the kernel (a throw-away socket), and
# the Redis answering there must report the pid started here and
# appendfsync always; anything else aborts instead of measuring a stranger.

say() { printf '\n=== %s\n' "$*"; }

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

ensure_redis() {
  if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
    say "installing redis-server and redis-tools"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null
  fi
  # The Debian package starts a system Redis on 6379; it is not used here.
}

# ringkv binaries (ringkv-server, ringkv-bench, loadgen): $BIN_DIR if set
# (e.g. a saved baseline build, to compare two builds in one session), else
# a fresh release build.
ringkv_binaries() {
  if [ -n "${BIN_DIR:-}" ]; then
    SERVER="$BIN_DIR/ringkv-server"
    BENCH="$BIN_DIR/ringkv-bench"
    LOADGEN="$BIN_DIR/loadgen"
  else
    cargo build --release -q -p ringkv-server --bin ringkv-server --example ringkv-bench
    cargo build --release -q -p loadgen --bin loadgen
    local target_dir
    target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
      sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    SERVER="${target_dir:-target}/release/ringkv-server"
    BENCH="${target_dir:-target}/release/examples/ringkv-bench"
    LOADGEN="${target_dir:-target}/release/loadgen"
  fi
}

WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringkv-vs-redis.XXXXXX")"
RINGKV_PID=""
REDIS_PID=""
stop_pid() {
  local pid="$1"
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
}
EXTRA_PIDS=""
cleanup() {
  set +e
  stop_pid "$RINGKV_PID"
  for pid in $EXTRA_PIDS; do stop_pid "$pid"; done
  stop_pid "$REDIS_PID"
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts Redis; sets REDIS_PORT and REDIS_PID.
start_redis() {
  REDIS_PORT=$(free_port)
  mkdir -p "$WORK/redis"
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$WORK/redis" --save '' \
    --appendonly yes --appendfsync always --daemonize no >"$WORK/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  redis-cli -p "$REDIS_PORT" ping >/dev/null
  local pid mode
  pid=$(redis-cli -p "$REDIS_PORT" info server | tr -d '\r' | sed -n 's/^process_id://p')
  [ "$pid" = "$REDIS_PID" ] || { echo "port $REDIS_PORT answers as pid '$pid', not the Redis started here ($REDIS_PID)"; exit 1; }
  mode=$(redis-cli -p "$REDIS_PORT" config get appendfsync | tr -d '\r' | sed -n 2p)
  [ "$mode" = "always" ] || { echo "Redis runs with appendfsync '$mode', not 'always'"; exit 1; }
  echo "redis on 127.0.0.1:$REDIS_PORT, pid $pid, appendfsync $mode"
}

# Starts ringkv-server with the native and the RESP listener; sets
# RINGKV_ADDR (native), RINGKV_RESP_PORT and RINGKV_PID. Extra arguments go
# to the server.
# Starts ringkv-server on $WORK/$RINGKV_NAME (default "ringkv", kept across
# restarts) with extra flags "$@"; waits READY_SECONDS (30) for its ready
# line (recovery first). A second server beside the first takes another
# RINGKV_NAME (and its pid goes into EXTRA_PIDS to be stopped on exit).
start_ringkv() {
  local name="${RINGKV_NAME:-ringkv}"
  mkdir -p "$WORK/$name"
  RUST_LOG=info "$SERVER" --data-dir "$WORK/$name" --listen 127.0.0.1:0 \
    --resp-listen 127.0.0.1:0 --durability sync "$@" >"$WORK/$name.log" 2>&1 &
  RINGKV_PID=$!
  for _ in $(seq $((${READY_SECONDS:-30} * 10))); do
    grep -q "ringkv-server ready" "$WORK/$name.log" && break
    kill -0 "$RINGKV_PID" 2>/dev/null || { cat "$WORK/$name.log"; exit 1; }
    sleep 0.1
  done
  local ready
  ready=$(grep "ringkv-server ready" "$WORK/$name.log" | head -1)
  RINGKV_ADDR=$(printf '%s\n' "$ready" | sed -n 's/.*addr=\([0-9.]*:[0-9]*\).*/\1/p')
  RINGKV_RESP_PORT=$(printf '%s\n' "$ready" | sed -n 's/.* resp=127\.0\.0\.1:\([0-9]*\).*/\1/p')
  [ -n "$RINGKV_ADDR" ] || { echo "no address in the ready line"; cat "$WORK/$name.log"; exit 1; }
  echo "ringkv pid $RINGKV_PID, native $RINGKV_ADDR, resp port ${RINGKV_RESP_PORT:-none}"
}

machine_line() {
  echo "cores: $(nproc), memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), kernel: $(uname -r), load: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# Installs Redis if needed, picks the ringkv binaries, prints the machine
# and both versions, and starts Redis: the common opening of a script that
# compares the two servers (start ringkv after it, with its own flags).
setup_both() {
  ensure_redis
  ringkv_binaries
  say "machine"
  machine_line
  echo "redis: $(redis-server --version)"
  echo "ringkv: $("$SERVER" --version)"
  start_redis
}
