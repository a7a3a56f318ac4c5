#!/usr/bin/env bash
# One short crash-audited loadgen run against the real ringkv-server binary
# (CI calls this): put/get with sync durability on each tier, two SIGKILLs
# and restarts, every acknowledged write read back. It must report "lost 0",
# "durability audit passed", write the crash section into --json and the
# timeline chart, and exit 0. Takes well under a minute after the build.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[ci-crash-audit] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

log "building ringkv-server and loadgen"
cargo build --quiet -p ringkv-server -p loadgen
target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin="${target_dir:-target}/debug"
[ -x "$bin/ringkv-server" ] || fail "no $bin/ringkv-server"
[ -x "$bin/loadgen" ] || fail "no $bin/loadgen"

work=$(mktemp -d "${TMPDIR:-/tmp}/ci-crash-audit.XXXXXX")
trap 'rm -rf "$work"' EXIT

for tier in memory hybrid; do
  log "tier $tier: 2 kills in 4 s of put/get"
  status=0
  "$bin/loadgen" --device unthrottled --tier "$tier" --durability sync \
    --records 5K --threads 4 --batch 100 --duration 4 --crashes 2 --timeout 30 \
    --json "$work/$tier.json" --plot "$work/$tier.svg" >"$work/$tier.txt" 2>"$work/$tier.err" || status=$?
  cat "$work/$tier.txt"
  [ "$status" -eq 0 ] || { cat "$work/$tier.err" >&2; fail "loadgen exited $status on tier $tier"; }
  grep -q "lost 0" "$work/$tier.txt" || fail "tier $tier: no 'lost 0'"
  grep -q "durability audit passed" "$work/$tier.txt" || fail "tier $tier: audit did not pass"
  grep -q '"crash"' "$work/$tier.json" || fail "tier $tier: JSON lacks the crash section"
  head -c 200 "$work/$tier.svg" | grep -q "<svg" || fail "tier $tier: no SVG chart"
done
log "ok"
