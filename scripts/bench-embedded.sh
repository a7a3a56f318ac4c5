#!/usr/bin/env bash
# ringkv's embedded API (`ringkv_engine::Db`, engine/benches/embedded)
# against LMDB (Debian's liblmdb-dev, driven by scripts/bench/lmdb_sweep.c)
# on the MapDB/ChronicleMap document's shape: 8-byte keys, 32-byte values,
# one thread, one call per item; N puts in key order, then N uniform reads.
# Both use the same value generator and the same read draws. The stores
# run in turns, ROUNDS times, each on a fresh directory under DIR; the
# table gives every run and then the median of each row, with LMDB's time
# over ringkv's (at or above 1.00: ringkv is at least as fast).
#
# Rows:
#   async N      ringkv `async` (on the device within flush_interval),
#                memory tier; LMDB MDB_NOSYNC, every put in one transaction
#   sync 1       10K durable single-key commits (ringkv `sync`: each put
#                returns once on the device; LMDB one synced commit per put)
#   sync 1000    1M keys in durable commits of 1,000 (Db::batch; LMDB one
#                synced transaction per 1,000 puts)
#   hybrid       ringkv only: 10M items, hybrid tier, 64 MiB cache, reads
#                per second against the value device's profile IOPS
#
# Usage: scripts/bench-embedded.sh
# Env:   ROUNDS (3), SIZES ("1000000 10000000"), DIR (/tmp), PROFILE (nvme),
#        HYBRID_ITEMS (10000000), HYBRID_READS (200000), SKIP_HYBRID (unset)
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
SIZES="${SIZES:-1000000 10000000}"
DIR="${DIR:-/tmp}"
PROFILE="${PROFILE:-nvme}"
HYBRID_ITEMS="${HYBRID_ITEMS:-10000000}"
HYBRID_READS="${HYBRID_READS:-200000}"
WORK="$(mktemp -d "$DIR/ringkv-embedded.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

if [ ! -f /usr/include/lmdb.h ]; then
  apt-get install -y liblmdb-dev >/dev/null
fi
cc -O2 -o "$WORK/lmdb_sweep" scripts/bench/lmdb_sweep.c -llmdb
cargo bench -p ringkv-engine --bench embedded --no-run 2>/dev/null
RINGKV="$(ls -t target/release/deps/embedded-* | grep -v '\.d$' | head -1)"

echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ), profile $PROFILE"
OUT="$WORK/runs.jsonl"
ringkv() { "$RINGKV" --json --dir "$WORK" --profile "$PROFILE" "$@" 2>/dev/null; }
lmdb() {
  rm -rf "$WORK/lmdb" && mkdir "$WORK/lmdb"
  "$WORK/lmdb_sweep" "$WORK/lmdb" "$@"
  rm -rf "$WORK/lmdb"
}
row() { python3 -c 'import json,sys; d=json.loads(sys.argv[2]); d["row"]=sys.argv[1]; print(json.dumps(d))' "$1" "$2" >>"$OUT"; }

for round in $(seq 1 "$ROUNDS"); do
  for n in $SIZES; do
    row "async $n" "$(ringkv --items "$n" --durability async)"
    row "async $n" "$(lmdb "$n" nosync)"
  done
  row "sync 1" "$(ringkv --items 10000 --durability sync)"
  row "sync 1" "$(lmdb 10000 sync 1)"
  row "sync 1000" "$(ringkv --items 1000000 --durability sync --batch 1000)"
  row "sync 1000" "$(lmdb 1000000 sync 1000)"
  if [ -z "${SKIP_HYBRID:-}" ]; then
    row "hybrid" "$(ringkv --items "$HYBRID_ITEMS" --reads "$HYBRID_READS" --durability async --tier hybrid --cache-mib 64)"
  fi
done

python3 - "$OUT" "$PROFILE" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
profile = sys.argv[2]
print(f"{'row':<14} {'store':<7} {'write ns/key':>13} {'read ns/key':>12} {'write cpu s':>12} {'read cpu s':>11}")
for r in runs:
    print(f"{r['row']:<14} {r['store']:<7} {r['write_ns']:>13,.0f} {r['read_ns']:>12,.0f} {r['write_cpu_s']:>12.3f} {r['read_cpu_s']:>11.3f}")
print()
print("medians; ratio = LMDB time / ringkv time (>= 1.00: ringkv at least as fast)")
print(f"{'row':<14} {'ringkv write':>13} {'LMDB write':>11} {'ratio':>6} {'ringkv read':>12} {'LMDB read':>10} {'ratio':>6}")
rows = []
for r in runs:
    if r["row"] not in rows:
        rows.append(r["row"])
for name in rows:
    med = {}
    for store in ("ringkv", "lmdb"):
        mine = [r for r in runs if r["row"] == name and r["store"] == store]
        if mine:
            med[store] = (statistics.median(r["write_ns"] for r in mine),
                          statistics.median(r["read_ns"] for r in mine))
    if "lmdb" in med:
        (rw, rr), (lw, lr) = med["ringkv"], med["lmdb"]
        print(f"{name:<14} {rw:>13,.0f} {lw:>11,.0f} {lw / rw:>6.2f} {rr:>12,.0f} {lr:>10,.0f} {lr / rr:>6.2f}")
    else:
        rw, rr = med["ringkv"]
        mine = [r for r in runs if r["row"] == name][0]
        reads_s = 1e9 / rr
        iops, burst = mine["profile_iops"], mine["profile_burst_iops"]
        limit = f"; profile {profile}: {iops:,} IOPS, burst {burst:,}: {reads_s / burst:.2f}x the burst" if iops else ""
        print(f"{name:<14} {rw:>13,.0f} {'-':>11} {'':>6} {rr:>12,.0f} {'-':>10} {'':>6}  ({reads_s:,.0f} reads/s{limit})")
PY
