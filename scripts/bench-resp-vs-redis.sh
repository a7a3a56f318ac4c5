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
# The servers are started and checked by scripts/lib/bench-common.sh (the
# same code as scripts/bench-vs-redis.sh, which runs these rows too with
# RESP=1): kernel-picked ports, Redis's pid and appendfsync verified.
#
# Usage: scripts/bench-resp-vs-redis.sh [ROUNDS=3]
# Env:   N_P1 (20000), N_P16 (100000), N_P1000 (400000), RINGKV_SHARDS (0),
#        BIN_DIR (binaries to use instead of a fresh release build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-common.sh
. scripts/lib/bench-resp-rows.sh

ROUNDS="${1:-3}"
RINGKV_SHARDS="${RINGKV_SHARDS:-0}"

setup_both
start_ringkv --shards "$RINGKV_SHARDS"
resp_rows "$ROUNDS"
