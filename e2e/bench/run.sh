#!/usr/bin/env bash
# Benchmarks (issue: e2e/bench). Starts a real stack per storage backend and runs
# bench.py against it; prints a table per backend and writes e2e/bench/results.json.
#   BENCH_TRIALS=5 BENCH_SIZES="10,100,1024" bash e2e/bench/run.sh
#   BENCH_STORAGE=dir BENCH_ONLY=sandbox DENV_BIN_DIR=target/release bash e2e/bench/run.sh
set -euo pipefail
E2E="$(cd "$(dirname "$0")/.." && pwd)"
source "$E2E/lib/stack.sh"
OUT="${BENCH_OUT:-$E2E/bench/results.json}"
echo '{}' > "$OUT"
for storage in ${BENCH_STORAGE:-dir btrfs}; do
  flag=""; [ "$storage" = btrfs ] && flag="--btrfs"
  stack_up $flag || { stack_logs; exit 1; }
  trap 'stack_down' EXIT
  python3 "$E2E/bench/bench.py" --storage "$storage" --out "$OUT" ${BENCH_ONLY:+--only "$BENCH_ONLY"} || { stack_logs; exit 1; }
  stack_down
  trap - EXIT
done
echo "results: $OUT"
