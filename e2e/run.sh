#!/usr/bin/env bash
# End-to-end suite: real denv-cp + denvd processes against the real Docker engine,
# driven by the real CLI (and curl for REST routes). Runs every case on `dir` storage
# and again on `btrfs`. Prints one PASS/FAIL line per case and ends with the plain
# closing line `e2e: N passed, N failed`. Exits non-zero on any failure, printing the
# control plane's and the sidecar's logs.
#
#   bash e2e/run.sh                 # all cases, dir then btrfs
#   E2E_STORAGE=dir bash e2e/run.sh quickstart files   # a subset on one backend
set -uo pipefail
E2E="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/stack.sh
source "$E2E/lib/stack.sh"
# shellcheck source=lib/assert.sh
source "$E2E/lib/assert.sh"

CASES=("$@")
[ ${#CASES[@]} -eq 0 ] && mapfile -t CASES < <(ls "$E2E/cases" | sed -n 's/^\([0-9][0-9]-\)\?\(.*\)\.sh$/\1\2/p')
STORAGES=(${E2E_STORAGE:-dir btrfs})

passed=0; failed=0; failures=()
for storage in "${STORAGES[@]}"; do
  flag=""; [ "$storage" = btrfs ] && flag="--btrfs"
  if ! stack_up $flag; then
    echo "FAIL stack_up ($storage)"; failed=$((failed+1)); failures+=("stack_up/$storage"); stack_down; continue
  fi
  for c in "${CASES[@]}"; do
    f="$E2E/cases/$c.sh"; [ -f "$f" ] || f="$(ls "$E2E"/cases/*-"$c".sh 2>/dev/null | head -1)"
    [ -f "$f" ] || { echo "no such case: $c"; failed=$((failed+1)); continue; }
    name="$(basename "$f" .sh)/$storage"
    start=$(date +%s)
    out="$(mktemp)"
    if ( set -e; cd "$(mktemp -d)"; source "$f" ) >"$out" 2>&1; then
      echo "PASS $name ($(( $(date +%s) - start ))s)"; passed=$((passed+1))
    else
      echo "FAIL $name ($(( $(date +%s) - start ))s)"; failed=$((failed+1)); failures+=("$name")
      sed 's/^/    /' "$out" | tail -n 60
    fi
    rm -f "$out"
  done
  [ $failed -gt 0 ] && stack_logs
  stack_down
done

echo
[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[*]}"
echo "e2e: $passed passed, $failed failed"
[ $failed -eq 0 ]
