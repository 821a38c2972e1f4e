#!/usr/bin/env bash
# Python conformance: venvs, the package built into the py312 venv, the OpenEnv echo
# image, then a throwaway stack (denv-cp + denvd, e2e/lib/stack.sh) unless DENV_SERVER
# and DENV_API_KEY already point at one, then conformance.py.
#
#   e2e/python/run.sh [CHECK...]     # checks: conformance.py's (client verify inspect … verifiers hud)
#
# Exits non-zero on any failure, printing the stack's logs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${DENV_VENV_DIR:-/var/cache/denv/venvs}/py312"

venvs="${DENV_VENV_DIR:-/var/cache/denv/venvs}"
bash "$here/setup.sh" py312 vf hud
# A dev-profile build shares the workspace's debug artifacts (a release build would
# compile every dependency again). One wheel, installed into the three venvs.
wheels="$(mktemp -d /tmp/denv-wheel.XXXXXX)"
trap 'rm -rf "$wheels"' EXIT
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" MATURIN_PEP517_ARGS="--profile dev" \
  "$venv/bin/python" -m pip wheel -q --no-deps -w "$wheels" "$root/bindings/python"
whl="$(ls "$wheels"/denv-*.whl)"
"$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$whl"
"$venv/bin/python" -m pip install -q "${whl}[all]"
for v in vf hud; do "$venvs/$v/bin/python" -m pip install -q --force-reinstall --no-deps "$whl"; done
bash "$here/fixtures/openenv-echo/build.sh"
bash "$here/fixtures/hud-env/build.sh" "$venvs/hud/bin/python"

# The package's own unit tests (under CI=true a skip fails: tests/conftest.py).
echo "python: unit tests (bindings/python/tests)"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$root/bindings/python/tests"

own_stack=0
if [ -z "${DENV_SERVER:-}" ] || [ -z "${DENV_API_KEY:-}" ]; then
  (cd "$root" && cargo build -q -p denv-cp -p denvd -p denv-cli)
  # shellcheck source=../lib/stack.sh
  . "$root/e2e/lib/stack.sh"
  stack_up
  own_stack=1
fi

rc=0
HARBOR_TELEMETRY=0 "$venv/bin/python" "$here/conformance.py" "$@" || rc=$?
if [ "$rc" -ne 0 ] && [ "$own_stack" = 1 ]; then stack_logs; fi
if [ "$own_stack" = 1 ]; then stack_down; fi
exit "$rc"
