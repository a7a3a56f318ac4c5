#!/usr/bin/env bash
# Checks for dead code in the engine's internal modules (issue #46).
#
# Built without the `internals` feature, `tier` and `wal` allow dead_code
# (engine/src/lib.rs): some of their items are called only by the engine's
# own tests and benches, through that feature. The allow would also hide an
# item nothing calls at all. So this builds the engine's library once more
# without the feature and with the lint forced on (`--force-warn dead_code`
# overrides every allow), and compares what it reports with the items
# known to be there for tests and benches (scripts/engine-test-only-items.txt,
# one "file item" a line, each with who calls it).
#
# Fails on an item the list does not name: delete it, or, if a test or
# bench calls it, add it to the list saying which. A listed item the lint
# no longer reports is printed, to be taken off the list.
#
# Usage: scripts/check-engine-dead-code.sh
set -euo pipefail
cd "$(dirname "$0")/.."
list=scripts/engine-test-only-items.txt

if ! out=$(cargo rustc -p ringkv-engine --lib --profile check --message-format short \
  -- --force-warn dead_code 2>&1); then
  echo "$out" >&2
  echo "check-engine-dead-code: the engine did not build" >&2
  exit 2
fi

# "file item" for every item the lint names; one warning may name several
# (`methods `a` and `b` are never used`).
found=$(echo "$out" | awk '
  / warning: .* (is|are) never (used|constructed|read)/ {
    file = $1; sub(/:.*/, "", file)
    line = $0; sub(/^[^`]*/, "", line)
    while (match(line, /`[^`]+`/)) {
      print file, substr(line, RSTART + 1, RLENGTH - 2)
      line = substr(line, RSTART + RLENGTH)
    }
  }' | sort -u)
known=$(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$list" | awk '{print $1, $2}' | sort -u)

unknown=$(comm -23 <(echo "$found") <(echo "$known") | sed '/^$/d')
stale=$(comm -13 <(echo "$found") <(echo "$known") | sed '/^$/d')
if [[ -n "$stale" ]]; then
  echo "check-engine-dead-code: listed in $list but no longer dead in the library build (take them off the list):"
  echo "$stale" | sed 's/^/  /'
fi
if [[ -n "$unknown" ]]; then
  echo "check-engine-dead-code: dead code the list does not name (delete it, or list it with the test or bench that calls it):"
  echo "$unknown" | sed 's/^/  /'
  exit 1
fi
echo "check-engine-dead-code: $(echo "$found" | sed '/^$/d' | wc -l) items unused by the library, all listed as used by tests or benches"
