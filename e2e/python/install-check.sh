#!/usr/bin/env bash
# `pip install ./bindings/python[all]` into a fresh venv for each of Python 3.11, 3.12,
# 3.13 (maturin compiles the native module; the cargo build cache is shared through
# CARGO_TARGET_DIR), then imports every module and runs the unit tests.
#
#   e2e/python/install-check.sh [311 312 313]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
vers=("$@"); [ "${#vers[@]}" -eq 0 ] && vers=(311 312 313)
fail=0
for v in "${vers[@]}"; do
  py=""
  for cand in /root/.pyenv/versions/3.${v#3}.*/bin/python3 "$(command -v "python3.${v#3}" || true)"; do
    [ -x "$cand" ] && { py="$cand"; break; }
  done
  [ -n "$py" ] || { echo "py$v: no interpreter, skipped"; continue; }
  dir="${DENV_VENV_DIR:-/var/cache/denv/venvs}/fresh-py$v"
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  # Pin the frameworks to what setup.sh resolved: pip's resolver can spend many minutes
  # backtracking over these dependency trees otherwise.
  cons=()
  if [ -f "${DENV_VENV_DIR:-/var/cache/denv/venvs}/py$v/versions.txt" ]; then
    grep -v -i -E '^(denv|-e )|@ file:' "${DENV_VENV_DIR:-/var/cache/denv/venvs}/py$v/versions.txt" > "$dir/constraints.txt"
    cons=(-c "$dir/constraints.txt")
  fi
  if "$dir/bin/python" -m pip install -q "${cons[@]}" "$root/bindings/python[all]" pytest \
     && (cd "$dir" && "$dir/bin/python" -c '
import importlib, sys
mods = ["denv", "denv._native", "denv.client", "denv.aio", "denv.inspect", "denv._inspect_registry", "denv.openenv"]
if sys.version_info >= (3, 12):
    mods.append("denv.harbor")
for m in mods:
    importlib.import_module(m)
import denv._native as n
assert "CreateSandbox" in n.methods()
print("imports ok:", ", ".join(mods))
') \
     && (cd "$dir" && "$dir/bin/python" -m pytest -q -p no:cacheprovider "$root/bindings/python/tests" | tail -1); then
    echo "py$v PASS ($("$dir/bin/python" -m pip freeze | grep -i -E '^(denv|harbor|inspect.ai|openenv.core)==' | tr '\n' ' '))"
  else
    echo "py$v FAIL"; fail=1
  fi
done
exit "$fail"
