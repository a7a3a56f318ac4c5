#!/usr/bin/env bash
# Scale-out demo (docs/scale-out.md): three ringkv-server processes behind
# twemproxy (Debian's `nutcracker`) on loopback, with ketama consistent
# hashing and auto_eject_hosts: false (the data is persistent: a node that
# is down must not have its keys re-homed to the others).
#
# Installs what it needs on Debian (nutcracker, redis-tools; python3-venv
# and redis-py 8.1.0 from PyPI in a venv), builds ringkv-server, then:
#   1. starts 3 nodes (`--resp-listen 127.0.0.1:0`, kernel-picked ports)
#      and nutcracker on a free port;
#   2. runs redis-benchmark (SET, GET, INCR) through the proxy;
#   3. runs a redis-py client (protocol=2, as twemproxy speaks RESP2 only)
#      through the proxy: writes 3,000 keys, reads them back, MGET across
#      nodes, INCR;
#   4. prints how the keys spread over the nodes (DBSIZE on each) and
#      checks every node got a share.
# Exits non-zero on any failure. Set KEEP=1 to leave the work dir.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[cluster-demo] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

REDIS_PY_VERSION=8.1.0
NODES=3
KEYS=3000

need=()
command -v nutcracker >/dev/null || [ -x /usr/sbin/nutcracker ] || need+=(nutcracker)
command -v redis-benchmark >/dev/null || need+=(redis-tools)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
nutcracker_bin=$(command -v nutcracker || echo /usr/sbin/nutcracker)

log "building ringkv-server"
cargo build --quiet -p ringkv-server
target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/debug/ringkv-server"
[ -x "$bin" ] || fail "no $bin"

work=$(mktemp -d "${TMPDIR:-/tmp}/cluster-demo.XXXXXX")
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  [ "${KEEP:-0}" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

# A port nobody listens on now (the kernel picks it; nutcracker has no
# "port 0" of its own).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

ports=()
for n in $(seq 1 "$NODES"); do
  mkdir -p "$work/node$n"
  # Created here: the background job opens it only after the fork, and the
  # loop below may read it first.
  : >"$work/node$n/server.log"
  "$bin" --data-dir "$work/node$n/data" --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 \
    --shards 1 --durability sync >"$work/node$n/server.log" 2>&1 &
  pids+=($!)
  port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's/.*ringkv-server ready.* resp=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/node$n/server.log")
    [ -n "$port" ] && break
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/node$n/server.log" >&2; fail "node$n exited"; }
    sleep 0.1
  done
  [ -n "$port" ] || fail "node$n did not become ready"
  ports+=("$port")
  log "node$n: ringkv-server, RESP on 127.0.0.1:$port"
done

proxy_port=$(free_port)
stats_port=$(free_port)
{
  echo "ringkv:"
  echo "  listen: 127.0.0.1:$proxy_port"
  echo "  hash: fnv1a_64"
  echo "  distribution: ketama"
  echo "  auto_eject_hosts: false"
  echo "  redis: true"
  echo "  timeout: 5000"
  echo "  server_connections: 1"
  echo "  servers:"
  for n in $(seq 1 "$NODES"); do
    echo "   - 127.0.0.1:${ports[$((n - 1))]}:1 node$n"
  done
} >"$work/nutcracker.yml"
"$nutcracker_bin" -t -c "$work/nutcracker.yml" >/dev/null 2>&1 || fail "nutcracker rejects $work/nutcracker.yml"
"$nutcracker_bin" -c "$work/nutcracker.yml" -s "$stats_port" -a 127.0.0.1 \
  -p "$work/nutcracker.pid" -o "$work/nutcracker.log" &
pids+=($!)
for _ in $(seq 1 100); do
  redis-cli -h 127.0.0.1 -p "$proxy_port" SET demo:probe 1 >/dev/null 2>&1 && break
  sleep 0.1
done
[ "$(redis-cli -h 127.0.0.1 -p "$proxy_port" GET demo:probe)" = 1 ] || fail "nutcracker does not answer"
log "nutcracker (ketama, auto_eject_hosts: false) on 127.0.0.1:$proxy_port"

log "redis-benchmark through the proxy"
out=$(redis-benchmark -h 127.0.0.1 -p "$proxy_port" -t set,get,incr -n 3000 -c 8 -r 10000 -q 2>&1 |
  tr '\r' '\n' | grep 'requests per second' || true)
printf '%s\n' "$out" >&2
for t in SET GET INCR; do
  printf '%s\n' "$out" | grep -q "^$t: " || fail "redis-benchmark has no $t result"
done

log "redis-py $REDIS_PY_VERSION (protocol=2) through the proxy"
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "redis==$REDIS_PY_VERSION"
"$work/venv/bin/python" - "$proxy_port" "$KEYS" <<'EOF'
import sys
import redis

port, count = int(sys.argv[1]), int(sys.argv[2])
# driver_info=None: no CLIENT SETINFO on connect (twemproxy does not
# forward CLIENT and closes the connection on it).
r = redis.Redis(
    host="127.0.0.1", port=port, protocol=2, decode_responses=True, driver_info=None
)
for i in range(count):
    r.set(f"user:{i}", f"value-{i}")
for i in range(count):
    assert r.get(f"user:{i}") == f"value-{i}", i
# MGET and MSET across nodes: twemproxy splits them by key.
keys = [f"user:{i}" for i in range(0, count, 97)]
assert r.mget(keys) == [f"value-{i}" for i in range(0, count, 97)]
r.mset({f"pair:{i}": str(i) for i in range(50)})
assert r.mget([f"pair:{i}" for i in range(50)]) == [str(i) for i in range(50)]
assert r.incr("counter") == 1 and r.incr("counter") == 2
assert r.delete("counter") == 1
print(f"redis-py: {count} keys written and read back, MGET/MSET/INCR/DEL through the proxy")
EOF

log "how the keys spread (DBSIZE on each node)"
total=0
for n in $(seq 1 "$NODES"); do
  keys=$(redis-cli -h 127.0.0.1 -p "${ports[$((n - 1))]}" DBSIZE)
  total=$((total + keys))
  printf '  node%d (127.0.0.1:%s): %s keys\n' "$n" "${ports[$((n - 1))]}" "$keys" >&2
  [ "$keys" -gt 0 ] || fail "node$n holds no keys"
done
log "total $total keys over $NODES nodes"
[ "$total" -ge "$KEYS" ] || fail "fewer keys than written"
log "cluster demo passed"
