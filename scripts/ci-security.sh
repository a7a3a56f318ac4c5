#!/usr/bin/env bash
# Security checks that need tools from outside Rust (CI calls this).
#
# 1. Installs openssl if it is missing (apt-get), so the tests that drive
#    `openssl s_client` run instead of skipping, and runs the password and TLS
#    test suites with RINGKV_REQUIRE_OPENSSL=1 (a skip is then a failure).
# 2. End to end with the real binaries and an openssl-made certificate:
#    protected mode refuses 0.0.0.0 without a password; a server with a
#    password file and TLS serves the `ringkv` CLI with --ca, refuses it
#    without the password and without TLS; `openssl s_client` verifies the
#    chain; loadgen --server runs briefly over TLS with the password; a new
#    certificate is picked up on SIGHUP.
# 3. The RESP port over TLS (server.tls_resp) with Redis's own clients:
#    `redis-cli --tls --cacert` (Debian's redis-tools) and redis-py with
#    ssl=True (a venv, redis-py 8.1.0 from PyPI, as scripts/ci-resp.sh);
#    plaintext is refused on that port; with server.tls_client_ca_file a
#    client without a certificate, or with one the CA did not sign, is
#    refused and one with a good certificate is served.
# Any failure exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[ci-security] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

REDIS_PY_VERSION=8.1.0

need_tools=()
command -v openssl >/dev/null 2>&1 || need_tools+=(openssl)
command -v redis-cli >/dev/null 2>&1 || need_tools+=(redis-tools)
# Debian's python3 has no ensurepip (so no venv) without python3-venv.
python3 -c 'import ensurepip' 2>/dev/null || need_tools+=(python3-venv)
if [ ${#need_tools[@]} -gt 0 ]; then
  log "installing ${need_tools[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_tools[@]}" >/dev/null
fi
command -v openssl >/dev/null 2>&1 || fail "openssl is not available"
command -v redis-cli >/dev/null 2>&1 || fail "redis-cli is not available"
openssl version

log "password, TLS and listener test suites (openssl required)"
RINGKV_REQUIRE_OPENSSL=1 cargo nextest run --profile ci -p ringkv-server --test auth --test tls \
  --test listeners

cargo build --quiet -p ringkv-server -p ringkv-client -p loadgen
target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/debug"

work=$(mktemp -d "${TMPDIR:-/tmp}/ci-security.XXXXXX")
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

log "protected mode"
if "$bin/ringkv-server" --data-dir "$work/open" --listen 0.0.0.0:0 2>"$work/open.err"; then
  fail "a server on 0.0.0.0 without a password started"
fi
grep -q "protected mode" "$work/open.err" || fail "no protected-mode message: $(cat "$work/open.err")"

make_cert() { # $1 = file prefix
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=ringkv-ci" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -addext "basicConstraints=critical,CA:FALSE" \
    -keyout "$1.key.tmp" -out "$1.pem.tmp" 2>/dev/null
}
make_cert "$work/one"
mv "$work/one.key.tmp" "$work/server.key"
mv "$work/one.pem.tmp" "$work/server.pem"
cp "$work/server.pem" "$work/ca-one.pem"
head -c 24 /dev/urandom | base64 >"$work/password"
export RINGKV_PASSWORD
RINGKV_PASSWORD=$(cat "$work/password")

log "starting a server with a password and TLS"
: >"$work/server.log" # exists before the wait loop reads it
"$bin/ringkv-server" --data-dir "$work/data" --listen 127.0.0.1:0 --shards 2 \
  --password-file "$work/password" --tls-cert "$work/server.pem" --tls-key "$work/server.key" \
  >"$work/server.log" 2>&1 &
server_pid=$!
addr=""
for _ in $(seq 1 300); do
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; fail "server exited"; }
  addr=$(sed -n 's/.*ringkv-server ready.* addr=\([0-9.:]*\).*/\1/p' "$work/server.log" | head -1)
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || fail "server not ready within 30 s"
log "server on $addr"

"$bin/ringkv" --server "$addr" --ca "$work/ca-one.pem" put ci-key ci-value | grep -qx OK ||
  fail "put over TLS with the password"
[ "$("$bin/ringkv" --server "$addr" --ca "$work/ca-one.pem" get ci-key)" = "ci-value" ] ||
  fail "get over TLS"
if RINGKV_PASSWORD="" "$bin/ringkv" --server "$addr" --ca "$work/ca-one.pem" get ci-key 2>"$work/nopw.err"; then
  fail "served without the password"
fi
grep -q AUTH_REQUIRED "$work/nopw.err" || fail "no AUTH_REQUIRED: $(cat "$work/nopw.err")"
if "$bin/ringkv" --server "$addr" get ci-key 2>/dev/null; then
  fail "a plaintext client was served on the TLS port"
fi

log "openssl s_client verifies the chain"
port=${addr##*:}
openssl s_client -connect "127.0.0.1:$port" -CAfile "$work/ca-one.pem" -verify_return_error \
  -brief </dev/null >"$work/sclient.txt" 2>&1 || { cat "$work/sclient.txt" >&2; fail "s_client"; }
grep -qi "verification: ok" "$work/sclient.txt" || fail "s_client did not verify: $(cat "$work/sclient.txt")"

log "loadgen --server over TLS with the password"
"$bin/loadgen" --server "$addr" --ca "$work/ca-one.pem" --threads 2 --batch 50 --records 1K \
  --warmup 0.2 --duration 0.5 --timeout 30 >"$work/loadgen.txt"
grep -q "Throughput" "$work/loadgen.txt" || fail "loadgen over TLS printed no table"

log "certificate rotation on SIGHUP"
make_cert "$work/two"
mv "$work/two.key.tmp" "$work/server.key"
mv "$work/two.pem.tmp" "$work/server.pem"
kill -HUP "$server_pid"
for _ in $(seq 1 100); do
  grep -q "TLS certificate files reloaded" "$work/server.log" && break
  sleep 0.1
done
grep -q "TLS certificate files reloaded" "$work/server.log" || fail "no reload after SIGHUP"
"$bin/ringkv" --server "$addr" --ca "$work/server.pem" get ci-key | grep -qx ci-value ||
  fail "the new certificate is not served"
if "$bin/ringkv" --server "$addr" --ca "$work/ca-one.pem" get ci-key 2>/dev/null; then
  fail "the old certificate is still served after the reload"
fi

kill -TERM "$server_pid"
wait "$server_pid" || fail "server did not exit cleanly"
server_pid=""

# Starts a server with the config file $1 and a RESP listener; sets $rport.
start_resp_tls() {
  local name=$1
  : >"$work/$name.log"
  "$bin/ringkv-server" --config "$work/$name.toml" --data-dir "$work/$name-data" \
    --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 --shards 2 >"$work/$name.log" 2>&1 &
  server_pid=$!
  rport=""
  for _ in $(seq 1 300); do
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/$name.log" >&2; fail "server exited"; }
    rport=$(sed -n 's/.*ringkv-server ready.* resp=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/$name.log" | head -1)
    [ -n "$rport" ] && break
    sleep 0.1
  done
  [ -n "$rport" ] || fail "server not ready within 30 s"
  log "RESP over TLS on 127.0.0.1:$rport ($name)"
}
stop_server() {
  kill -TERM "$server_pid"
  wait "$server_pid" || fail "server did not exit cleanly"
  server_pid=""
}

log "RESP over TLS: redis-cli --tls and redis-py ssl=True"
venv="$work/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q "redis==$REDIS_PY_VERSION"
cat >"$work/resp-tls.toml" <<EOF
[server]
password_file = "$work/password"
tls_resp = true
tls_cert_file = "$work/server.pem"
tls_key_file = "$work/server.key"
EOF
start_resp_tls resp-tls
rcli=(redis-cli -h 127.0.0.1 -p "$rport" --no-auth-warning -a "$RINGKV_PASSWORD")
[ "$("${rcli[@]}" --tls --cacert "$work/server.pem" SET resp-key resp-value)" = "OK" ] ||
  fail "redis-cli --tls SET"
[ "$("${rcli[@]}" --tls --cacert "$work/server.pem" GET resp-key)" = "resp-value" ] ||
  fail "redis-cli --tls GET"
if [ "$("${rcli[@]}" PING 2>/dev/null)" = "PONG" ]; then
  fail "plaintext redis-cli was served on the TLS RESP port"
fi
if [ "$("${rcli[@]}" --tls --cacert "$work/ca-one.pem" PING 2>/dev/null)" = "PONG" ]; then
  fail "redis-cli accepted a certificate its CA file does not hold"
fi
"$venv/bin/python" - "$rport" "$work/server.pem" <<'PY' || fail "redis-py ssl=True"
import os, sys
import redis
port, ca = int(sys.argv[1]), sys.argv[2]
r = redis.Redis(host="127.0.0.1", port=port, password=os.environ["RINGKV_PASSWORD"],
                ssl=True, ssl_ca_certs=ca, socket_timeout=30)
assert r.get("resp-key") == b"resp-value"
value = os.urandom(300_000)
assert r.set("py-key", value)
assert r.get("py-key") == value
with r.pipeline(transaction=True) as p:
    p.incr("py-counter").incr("py-counter")
    assert p.execute() == [1, 2]
print("redis-py over TLS: ok")
PY
stop_server

log "RESP over TLS with client certificates"
make_cert "$work/client"
mv "$work/client.key.tmp" "$work/client.key"
mv "$work/client.pem.tmp" "$work/client.pem"
make_cert "$work/stranger"
mv "$work/stranger.key.tmp" "$work/stranger.key"
mv "$work/stranger.pem.tmp" "$work/stranger.pem"
cp "$work/resp-tls.toml" "$work/resp-mtls.toml"
printf 'tls_client_ca_file = "%s"\n' "$work/client.pem" >>"$work/resp-mtls.toml"
start_resp_tls resp-mtls
rcli=(redis-cli -h 127.0.0.1 -p "$rport" --no-auth-warning -a "$RINGKV_PASSWORD" --tls
  --cacert "$work/server.pem")
if [ "$("${rcli[@]}" PING 2>/dev/null)" = "PONG" ]; then
  fail "a RESP client without a certificate was served"
fi
if [ "$("${rcli[@]}" --cert "$work/stranger.pem" --key "$work/stranger.key" PING 2>/dev/null)" = "PONG" ]; then
  fail "a RESP client with a certificate of another CA was served"
fi
[ "$("${rcli[@]}" --cert "$work/client.pem" --key "$work/client.key" PING)" = "PONG" ] ||
  fail "a RESP client with a good certificate was refused"
"$venv/bin/python" - "$rport" "$work" <<'PY' || fail "redis-py with a client certificate"
import os, sys
import redis
port, work = int(sys.argv[1]), sys.argv[2]
r = redis.Redis(host="127.0.0.1", port=port, password=os.environ["RINGKV_PASSWORD"],
                ssl=True, ssl_ca_certs=f"{work}/server.pem", ssl_certfile=f"{work}/client.pem",
                ssl_keyfile=f"{work}/client.key", socket_timeout=30)
assert r.ping()
bare = redis.Redis(host="127.0.0.1", port=port, password=os.environ["RINGKV_PASSWORD"],
                   ssl=True, ssl_ca_certs=f"{work}/server.pem", socket_timeout=30)
try:
    bare.ping()
except redis.exceptions.ConnectionError:
    pass
else:
    raise SystemExit("served without a client certificate")
print("redis-py with client certificates: ok")
PY
grep -q 'closed a RESP connection: TLS handshake failed' "$work/resp-mtls.log" ||
  fail "no log line for the refused client certificate"
stop_server
log "OK"
