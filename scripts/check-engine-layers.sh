#!/usr/bin/env bash
# Checks the engine's module layering: no import circle between its
# top-level modules (docs/architecture.md, "Layers"; issue #27).
#
# Every file under engine/src belongs to its top-level module: `wal/x.rs`
# and `wal.rs` to `wal`, `lib.rs` to the crate root. A file that names
# `crate::M` (in a `use` or in a path, also inside `crate::{...}` groups) or
# a root re-export of M (`crate::Engine` -> `engine`, read from lib.rs'
# `pub use` lines) gives an edge from its module to M. Comments are
# ignored; test modules count like any other code.
#
# The script then finds every circle (strongly connected set of modules)
# and prints it with the lines that make its edges. It fails if any circle
# exists among all modules, so a new one anywhere is caught, not only
# between wal/, shard/ and txn/.
#
# Usage: scripts/check-engine-layers.sh [engine/src]   (-v: print all edges)
set -euo pipefail
cd "$(dirname "$0")/.."

verbose=0
if [[ "${1:-}" == "-v" ]]; then verbose=1; shift; fi
src="${1:-engine/src}"
[[ -f "$src/lib.rs" ]] || { echo "check-engine-layers: no $src/lib.rs" >&2; exit 2; }

# One line per reference: "<from-module> <to-module> <file>:<line>".
edges=$(
  find "$src" -name '*.rs' | sort | while read -r f; do
    rel=${f#"$src"/}
    case "$rel" in
      lib.rs) from=crate ;;
      */*) from=${rel%%/*} ;;
      *) from=${rel%.rs} ;;
    esac
    awk -v from="$from" -v file="$f" -v lib="$src/lib.rs" '
      BEGIN {
        # Root re-exports: `pub use m::{A, B};` or `pub use m::x::A;` in lib.rs.
        text = ""
        while ((getline line < lib) > 0) { sub(/\/\/.*/, "", line); text = text " " line }
        while (match(text, /pub use [a-z_]+::[^;]*;/)) {
          stmt = substr(text, RSTART + 8, RLENGTH - 9)
          text = substr(text, RSTART + RLENGTH)
          m = stmt; sub(/::.*/, "", m)
          gsub(/[{},]/, " ", stmt)
          n = split(stmt, parts, /[ :]+/)
          for (i = 1; i <= n; i++) if (parts[i] ~ /^[A-Z]/) reexp[parts[i]] = m
        }
        ingroup = 0
      }
      {
        line = $0
        sub(/\/\/.*/, "", line)
        # Inside a multi-line `crate::{ ... }` group: every leading name counts.
        rest = line
        while (1) {
          if (ingroup) {
            seg = rest
            close_at = index(seg, "}")
            if (close_at > 0) { seg = substr(seg, 1, close_at - 1); rest = substr(rest, close_at + 1); ingroup = 0 }
            else rest = ""
            gsub(/\{[^}]*\}/, "", seg)
            n = split(seg, items, /,/)
            for (i = 1; i <= n; i++) {
              it = items[i]; gsub(/^[ \t]+/, "", it); sub(/[^A-Za-z0-9_].*/, "", it)
              if (it != "") emit(it)
            }
            if (rest == "") break
            continue
          }
          if (!match(rest, /crate::(\{|[A-Za-z_][A-Za-z0-9_]*)/)) break
          tok = substr(rest, RSTART + 7, RLENGTH - 7)
          rest = substr(rest, RSTART + RLENGTH)
          if (tok == "{") { ingroup = 1; continue }
          emit(tok)
        }
      }
      function emit(name,   to) {
        if (name ~ /^[A-Z]/) { if (!(name in reexp)) return; to = reexp[name] }
        else to = name
        if (to == "self" || to == "super") return
        if (to != from) print from, to, file ":" FNR
      }
    ' "$f"
  done
)

# Strongly connected sets via the transitive closure (the graph is small).
echo "$edges" | awk -v verbose="$verbose" '
  NF == 3 {
    if (!(($1, $2) in where)) { nedge++; where[$1, $2] = $3 } else if (length(where[$1, $2]) < 300) where[$1, $2] = where[$1, $2] " " $3
    adj[$1, $2] = 1; node[$1] = 1; node[$2] = 1
  }
  END {
    n = 0; for (v in node) names[++n] = v
    # sort names for stable output
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (names[j] < names[i]) { t = names[i]; names[i] = names[j]; names[j] = t }
    for (i = 1; i <= n; i++) for (j = 1; j <= n; j++) r[i, j] = ((names[i], names[j]) in adj)
    for (k = 1; k <= n; k++) for (i = 1; i <= n; i++) if (r[i, k]) for (j = 1; j <= n; j++) if (r[k, j]) r[i, j] = 1
    if (verbose) {
      for (i = 1; i <= n; i++) { out = ""; for (j = 1; j <= n; j++) if ((names[i], names[j]) in adj) out = out " " names[j]; if (out != "") printf "%s ->%s\n", names[i], out }
    }
    printf "engine modules: %d, module edges: %d\n", n, nedge
    circles = 0
    for (i = 1; i <= n; i++) {
      if (done[i] || !r[i, i]) continue
      members = ""; cnt = 0
      for (j = 1; j <= n; j++) if (j == i || (r[i, j] && r[j, i])) { done[j] = 1; members = members " " names[j]; idx[++cnt] = j }
      circles++
      printf "IMPORT CIRCLE:%s\n", members
      for (a = 1; a <= cnt; a++) for (b = 1; b <= cnt; b++) {
        x = names[idx[a]]; y = names[idx[b]]
        if ((x, y) in adj) printf "  %s -> %s: %s\n", x, y, where[x, y]
      }
    }
    if (circles) { printf "check-engine-layers: %d import circle(s) between engine modules\n", circles; exit 1 }
    print "check-engine-layers: no import circle between engine modules"
  }
'
