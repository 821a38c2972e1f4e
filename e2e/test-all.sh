#!/usr/bin/env bash
# `just test` (what CI runs): every tier in turn — lint, unit, e2e, python — each ending
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

venv_log="$(mktemp /tmp/denv-venv.XXXXXX)"
bash e2e/python/setup.sh py312 vf hud >"$venv_log" 2>&1 &
venv_pid=$!

# tier NAME CMD...: run one tier, record its status and wall time.
tier() {
  local name=$1 t rc
  shift
  t=$(date +%s)
  printf '\n===== %s =====\n' "$name"
  "$@"
  rc=$?
  if [ "$rc" -eq 0 ]; then
    rows+=("$(printf '%-8s ok      %5ss' "$name" $(( $(date +%s) - t )))")
  else
    rows+=("$(printf '%-8s FAILED  %5ss (exit %s)' "$name" $(( $(date +%s) - t )) "$rc")")
    failed=$((failed + 1))
  fi
}

python_tier() {
  if ! wait "$venv_pid"; then
    echo "python: the conformance venv could not be made:"
    cat "$venv_log"
    echo "python: 0 passed, 1 failed"
    return 1
  fi
  sed -n '/^setup: /p; /^py3/p' "$venv_log"
  just python
}

tier lint just lint
tier unit just unit
tier e2e just e2e
tier python python_tier
rm -f "$venv_log"

printf '\n===== summary (%s s) =====\n' $(( $(date +%s) - T0 ))
printf '%s\n' "${rows[@]}"
echo "tiers: $(( ${#rows[@]} - failed )) passed, $failed failed"
[ "$failed" -eq 0 ]
