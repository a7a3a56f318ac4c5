#!/usr/bin/env bash
# docs/benchmarks.md, "Durable write path (issue 29): the issue's rows, before
# and after" (row 3: disk use over live data after restarts; docs/wal.md,
# "The checkpoint procedure", states the bound).
#
# For each build (BEFORE_DIR, AFTER_DIR) and each case, RESTARTS runs of
# ringkv-server on one data directory (memory tier, `--durability sync`, 2
# shards, device `unthrottled`, default checkpoint settings). Each run
# starts the server, waits for its ready line (recovery first), writes one
# batch over the RESP port, stops it with SIGTERM and waits for it to exit,
# then records what the data directory holds:
#
#   growing    each run writes MIB MiB of values under new keys (run r's
#              keys are `g:RR:NNNNNNNN`): live data grows by MIB MiB a run;
#   overwrite  each run writes the same keys `o:NNNNNNNN` (MIB MiB live),
#              overwriting all of them once.
#
# Writes are SETs of VALUE_BYTES-byte values, pipelined 100 at a time on one
# connection, every reply checked to be +OK. Live bytes = the keys' and
# values' bytes of the live set. Disk use = `du` (allocated blocks) of the
# shards' wal/ and snapshots/ directories.
#
# Usage: scripts/bench-disk-use.sh [growing|overwrite|all]
# Env:   BEFORE_DIR, AFTER_DIR (ringkv-server in each; either may be empty
#        to skip that build), RESTARTS (16), MIB (40), VALUE_BYTES (1000),
#        OUT (results dir)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib/bench-common.sh

CASES="${1:-all}"
[ "$CASES" = all ] && CASES="growing overwrite"
RESTARTS="${RESTARTS:-16}"
MIB="${MIB:-40}"
VALUE_BYTES="${VALUE_BYTES:-1000}"
OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/bench-disk-use.XXXXXX")}"
mkdir -p "$OUT"
KEYS_PER_RUN=$((MIB * 1048576 / VALUE_BYTES))

# write_batch PORT PREFIX: KEYS_PER_RUN SETs of PREFIX + 8-digit index.
write_batch() {
  python3 - "$1" "$2" "$KEYS_PER_RUN" "$VALUE_BYTES" <<'EOF'
import socket, sys
port, prefix, n, vb = int(sys.argv[1]), sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
value = b"v" * vb
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
f = s.makefile("rb")
for start in range(0, n, 100):
    cmds = []
    for i in range(start, min(n, start + 100)):
        key = prefix + b"%08d" % i
        cmds.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, vb, value))
    s.sendall(b"".join(cmds))
    for _ in cmds:
        line = f.readline()
        if line != b"+OK\r\n":
            sys.exit("unexpected reply %r" % line)
s.close()
EOF
}

du_bytes() { du -s --block-size=1 "$@" 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

# run_case BUILD DIR CASE: RESTARTS runs; appends one line per run to $OUT/rows:
# "build case run live_bytes wal_bytes snap_bytes ratio start_s write_s".
run_case() {
  local build="$1" dir="$2" case="$3" r prefix live keylen wal snap t0 t1 t2
  SERVER="$dir/ringkv-server"
  rm -rf "$WORK/ringkv"
  for r in $(seq "$RESTARTS"); do
    t0=$(date +%s.%N)
    start_ringkv --shards 2 --device-profile unthrottled
    t1=$(date +%s.%N)
    if [ "$case" = growing ]; then
      prefix=$(printf 'g:%02d:' "$r")
      keylen=$((${#prefix} + 8))
      live=$((r * KEYS_PER_RUN * (keylen + VALUE_BYTES)))
    else
      prefix="o:"
      keylen=$((${#prefix} + 8))
      live=$((KEYS_PER_RUN * (keylen + VALUE_BYTES)))
    fi
    write_batch "$RINGKV_RESP_PORT" "$prefix"
    t2=$(date +%s.%N)
    stop_pid "$RINGKV_PID"
    wait "$RINGKV_PID" 2>/dev/null || true
    RINGKV_PID=""
    cp "$WORK/ringkv.log" "$OUT/server-$build-$case-$r.log"
    wal=$(du_bytes "$WORK"/ringkv/shard-*/wal)
    snap=$(du_bytes "$WORK"/ringkv/shard-*/snapshots)
    awk -v b="$build" -v c="$case" -v r="$r" -v live="$live" -v w="$wal" -v s="$snap" \
      -v st="$(echo "$t1 - $t0" | bc)" -v wt="$(echo "$t2 - $t1" | bc)" \
      'BEGIN {printf "%s %s %d %.1f %.1f %.1f %.2f %.1f %.1f\n", b, c, r, live / 1048576, w / 1048576, s / 1048576, (w + s) / live, st, wt}' |
      tee -a "$OUT/rows"
  done
  ls -l "$WORK"/ringkv/shard-*/wal "$WORK"/ringkv/shard-*/snapshots >"$OUT/listing-$build-$case.txt"
  rm -rf "$WORK/ringkv"
}

say "machine"
machine_line
echo "$RESTARTS restarts per case, $KEYS_PER_RUN keys of $VALUE_BYTES B per run ($MIB MiB of values); out: $OUT"
echo "columns: build case run live_MiB wal_MiB snapshots_MiB (wal+snap)/live start_s write_s"
for case in $CASES; do
  for b in before after; do
    if [ "$b" = before ]; then dir="${BEFORE_DIR:-}"; else dir="${AFTER_DIR:-}"; fi
    [ -n "$dir" ] || continue
    say "$b ($("$dir/ringkv-server" --version)), $case, load $(cut -d' ' -f1-3 /proc/loadavg)"
    run_case "$b" "$dir" "$case"
  done
done
