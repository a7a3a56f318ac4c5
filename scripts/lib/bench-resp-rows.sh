# redis-benchmark against both servers (ringkv's RESP listener and Redis),
# for P in 1 16 1000: one client, two servers. Needs bench-common.sh and
# both servers started. Env: N_P1 (20000), N_P16 (100000), N_P1000 (400000).

# resp_bench PORT P N -> "set_rps get_rps"
resp_bench() {
  local out set get
  out=$(redis-benchmark -h 127.0.0.1 -p "$1" -t set,get -d 1000 -c 16 -r 100000 -P "$2" -n "$3" -q 2>&1 | tr '\r' '\n')
  set=$(printf '%s\n' "$out" | sed -n 's/^SET: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
  get=$(printf '%s\n' "$out" | sed -n 's/^GET: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1)
  echo "${set:-0} ${get:-0}"
}

resp_rows() {
  local rounds="$1" round P n rs rg ks kg
  [ -n "${RINGKV_RESP_PORT:-}" ] || { echo "ringkv has no RESP listener"; exit 1; }
  echo "ringkv RESP on 127.0.0.1:$RINGKV_RESP_PORT, CONFIG GET appendfsync = $(redis-cli -p "$RINGKV_RESP_PORT" CONFIG GET appendfsync | tail -n 1)"
  say "redis-benchmark -t set,get -d 1000 -c 16 -r 100000 against both (requests per second)"
  printf '%-6s %-6s %-8s %14s %14s\n' round P server SET GET
  for round in $(seq 1 "$rounds"); do
    for P in 1 16 1000; do
      case $P in 1) n=${N_P1:-20000} ;; 16) n=${N_P16:-100000} ;; *) n=${N_P1000:-400000} ;; esac
      read -r rs rg < <(resp_bench "$REDIS_PORT" "$P" "$n")
      printf '%-6s %-6s %-8s %14s %14s\n' "$round" "$P" redis "$rs" "$rg"
      read -r ks kg < <(resp_bench "$RINGKV_RESP_PORT" "$P" "$n")
      printf '%-6s %-6s %-8s %14s %14s\n' "$round" "$P" ringkv "$ks" "$kg"
    done
  done
}
