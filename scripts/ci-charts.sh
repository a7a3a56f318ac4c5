#!/usr/bin/env bash
# Renders every loadgen chart kind with an external SVG renderer (CI calls
# this): put/get, YCSB, sweep and compare charts are drawn from the reports
# checked in under loadgen/tests/charts/, then converted to PNG with
# rsvg-convert (Debian's librsvg2-bin, installed here if missing). Any error
# of loadgen or of the renderer exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[ci-charts] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; exit 1; }

if ! command -v rsvg-convert >/dev/null 2>&1; then
  log "installing librsvg2-bin"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq librsvg2-bin >/dev/null
fi
command -v rsvg-convert >/dev/null 2>&1 || fail "rsvg-convert is not installed"

log "building loadgen"
cargo build --quiet -p loadgen
target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
loadgen="${target_dir:-target}/debug/loadgen"
[ -x "$loadgen" ] || fail "no $loadgen"

charts=loadgen/tests/charts
work=$(mktemp -d "${TMPDIR:-/tmp}/ci-charts.XXXXXX")
trap 'rm -rf "$work"' EXIT

render() {
  local svg=$1
  [ -s "$svg" ] || fail "$svg is empty"
  rsvg-convert --format=png --output "${svg%.svg}.png" "$svg" || fail "rsvg-convert refused $svg"
  [ -s "${svg%.svg}.png" ] || fail "rsvg-convert wrote nothing for $svg"
  log "rendered $(basename "$svg") -> $(basename "${svg%.svg}.png") ($(wc -c <"${svg%.svg}.png") bytes)"
}

for kind in putget ycsb sweep; do
  "$loadgen" plot "$charts/$kind.json" "$work/$kind.svg" || fail "loadgen plot $kind"
  render "$work/$kind.svg"
done
"$loadgen" compare "$charts/putget.json" "$charts/putget-b.json" --plot "$work/compare.svg" >/dev/null ||
  fail "loadgen compare --plot"
render "$work/compare.svg"
log "all chart kinds rendered"
