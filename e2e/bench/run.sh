#!/usr/bin/env bash
# Benchmarks (issue: e2e/bench). Starts a real stack per storage backend and runs
# bench.py against it; prints a table per backend and writes e2e/bench/results.json
# (the machine and its load at the start are recorded with the figures). Runs the release
# build (target/release; `just bench` builds it) unless DENV_BIN_DIR says otherwise.
#   BENCH_TRIALS=5 BENCH_SIZES="10,100,1024" bash e2e/bench/run.sh
#   BENCH_STORAGE=btrfs BENCH_ONLY=quickfork,execs bash e2e/bench/run.sh
# Steps (BENCH_ONLY, comma-separated): quickfork, execs, sandbox, fork, verify, group, frozen,
# envs (BENCH_ENVS live environments, default 200), build, pool, ship (starts a second denvd;
# BENCH_SHIP_MIB, default 1024, BENCH_SHIP_TRIALS, default 2), hosts (three hosts vs one).
set -euo pipefail
E2E="$(cd "$(dirname "$0")/.." && pwd)"
export DENV_BIN_DIR="${DENV_BIN_DIR:-$(cd "$E2E/.." && pwd)/target/release}"
[ -x "$DENV_BIN_DIR/denvd" ] || { echo "no denvd in $DENV_BIN_DIR: cargo build --release --workspace --bins"; exit 1; }
source "$E2E/lib/stack.sh"
OUT="${BENCH_OUT:-$E2E/bench/results.json}"
# Results of backends not run this time are kept.
[ -s "$OUT" ] || echo '{}' > "$OUT"
for storage in ${BENCH_STORAGE:-dir btrfs}; do
  flag=""; [ "$storage" = btrfs ] && flag="--btrfs"
  stack_up $flag || { stack_logs; exit 1; }
  trap 'stack_down' EXIT
  python3 "$E2E/bench/bench.py" --storage "$storage" --out "$OUT" ${BENCH_ONLY:+--only "$BENCH_ONLY"} || { stack_logs; exit 1; }
  stack_down
  trap - EXIT
done
echo "results: $OUT"
