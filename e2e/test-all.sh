#!/usr/bin/env bash
# `just test` (what CI runs): every tier in turn — lint (fmt, then the one compile of
# everything with clippy's lints), unit (with the Helm chart's helm/test.sh), e2e, python — each ending
# with its own `<tier>: N passed, N failed` line. A failed tier does not stop the
# others; the script ends with one line per tier (status and wall time) and exits
# non-zero when any tier failed.
#
# The python tier's venvs (e2e/python/setup.sh py312 vf hud: package downloads and unpacking,
# minutes on a fresh machine, seconds after) is prepared in the background while the
# Rust tiers build and run; its log is printed if it fails.
set -uo pipefail
cd "$(dirname "$0")/.."

T0=$(date +%s)
rows=()
failed=0

# One compile for lint and tests (justfile `lint-build`): workspace crates are compiled
# by clippy's driver with warnings denied, the way `cargo clippy -- -D warnings` checks
# them, and every later cargo call of the tiers (which inherit this) reuses them.
RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver || true)"
if [ -z "$RUSTC_WORKSPACE_WRAPPER" ]; then
  echo "test-all: clippy-driver not found (rustup component add clippy)" >&2
  exit 2
fi
export RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS="-Dwarnings"

# Each failed Rust test's panic, printed again just before the summary (cargo-summary.sh).
DENV_FAILURES="$(mktemp /tmp/denv-failures.XXXXXX)"
export DENV_FAILURES

venv_log="$(mktemp /tmp/denv-venv.XXXXXX)"
bash e2e/python/setup.sh py312 vf hud >"$venv_log" 2>&1 &
venv_pid=$!

# tier NAME LIMIT CMD...: run one tier, record its status and wall time. A tier still
# running after LIMIT seconds is stopped with its whole process group (timeout(1)) and
# counted as failed, so one hang cannot use up the rest of a CI run's time.
tier() {
  local name=$1 limit=$2 t rc
  shift 2
  t=$(date +%s)
  printf '\n===== %s (started %s) =====\n' "$name" "$(date -u +%T)"
  timeout -k 60 "$limit" "$@"
  rc=$?
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "$name: stopped after ${limit}s, the tier's time limit"
  fi
  if [ "$rc" -eq 0 ]; then
    rows+=("$(printf '%-8s ok      %5ss' "$name" $(( $(date +%s) - t )))")
  else
    rows+=("$(printf '%-8s FAILED  %5ss (exit %s)' "$name" $(( $(date +%s) - t )) "$rc")")
    failed=$((failed + 1))
  fi
}

tier lint 1800 just lint-build
tier unit 2400 just unit
tier e2e 1800 just e2e
if wait "$venv_pid"; then
  sed -n '/^setup: /p; /^py3/p' "$venv_log"
  tier python 1800 just python
else
  printf '\n===== python =====\n'
  echo "python: the conformance venvs could not be made:"
  cat "$venv_log"
  echo "python: 0 passed, 1 failed"
  rows+=("$(printf '%-8s FAILED  (venvs)' python)")
  failed=$((failed + 1))
fi
rm -f "$venv_log"

if [ -s "$DENV_FAILURES" ]; then
  printf '\n===== why the failed tests failed =====\n'
  cat "$DENV_FAILURES"
fi
rm -f "$DENV_FAILURES"

printf '\n===== summary (%s s) =====\n' $(( $(date +%s) - T0 ))
printf '%s\n' "${rows[@]}"
echo "tiers: $(( ${#rows[@]} - failed )) passed, $failed failed"
[ "$failed" -eq 0 ]
