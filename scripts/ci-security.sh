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
# Any failure exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[ci-security] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

if ! command -v openssl >/dev/null 2>&1; then
  log "installing openssl"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq openssl >/dev/null
fi
command -v openssl >/dev/null 2>&1 || fail "openssl is not available"
openssl version

log "password and TLS test suites (openssl required)"
RINGKV_REQUIRE_OPENSSL=1 cargo nextest run --profile ci -p ringkv-server --test auth --test tls

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
log "OK"
