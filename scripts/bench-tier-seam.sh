#!/usr/bin/env bash
# Two builds side by side on the paths the tier's seam carries: durable
# puts (the engine bench `put_sync`, memory tier, `sync`) and, on the
# hybrid tier, durable puts and cold GETs through an embedded server
# (`loadgen`, 1M records, a 10 MiB cache: nearly every GET reads the
# device). The builds run in turns, ROUNDS times, so both see the same
# machine; beside each loadgen run the process's CPU time per operation
# (user + system over the put and get phases' operations, load included).
#
# Usage: A_DIR=<dir> B_DIR=<dir> scripts/bench-tier-seam.sh
#   each dir holds `loadgen` and `put_sync` (the bench binary, copied from
#   target/release/deps/put_sync-*) of one build.
# Env:   ROUNDS (3), RECORDS (1M), DEVICE (unthrottled), PHASE_SECONDS (10)
set -euo pipefail
cd "$(dirname "$0")/.."

: "${A_DIR:?A_DIR: the binaries of the first build}"
: "${B_DIR:?B_DIR: the binaries of the second build}"
ROUNDS="${ROUNDS:-3}"
RECORDS="${RECORDS:-1M}"
DEVICE="${DEVICE:-unthrottled}"
SECONDS_PER_PHASE="${PHASE_SECONDS:-10}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/ringkv-seam.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)"
printf '%-5s %-5s %12s %14s %14s %10s\n' round build put_sync/s hybrid_put/s cold_get/s cpu_us/op

for round in $(seq 1 "$ROUNDS"); do
  for build in A B; do
    dir="A_DIR"
    [ "$build" = B ] && dir="B_DIR"
    bin="${!dir}"
    ps_line="$("$bin/put_sync" --seconds "$SECONDS_PER_PHASE" --raw-seconds 0 --memory-keys 0 \
      --key-space 100000 --dir "$WORK/put-sync" 2>&1 | grep '^durable puts:')"
    rm -rf "$WORK/put-sync"
    ps_rate="$(echo "$ps_line" | sed -E 's/^durable puts: ([0-9]+)\/s.*/\1/')"
    json="$WORK/$build-$round.json"
    # /usr/bin/time's line is the last of the run's stderr.
    /usr/bin/time -f '%U %S' "$bin/loadgen" --tier hybrid --device "$DEVICE" \
      --records "$RECORDS" --cache-bytes 10MiB --batch 1 --threads 8 \
      --duration "$SECONDS_PER_PHASE" --warmup 3 --json "$json" >/dev/null 2>"$WORK/lg.err"
    cpu="$(tail -1 "$WORK/lg.err")"
    python3 - "$json" "$cpu" "$round" "$build" "$ps_rate" <<'PY'
import json, sys
path, cpu, round_, build, ps = sys.argv[1:]
results = json.load(open(path))["results"]
rate = {r["operation"]: r["ops_per_sec"] for r in results}
ops = sum(r["ops"] for r in results)
user, system = (float(x) for x in cpu.split())
print(f"{round_:<5} {build:<5} {int(ps):>12,} {rate['put']:>14,.0f} {rate['get']:>14,.0f} "
      f"{(user + system) / ops * 1e6:>10.2f}")
PY
  done
done
