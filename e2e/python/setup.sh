#!/usr/bin/env bash
# Creates the Python venvs used by the denv Python e2e/conformance suite.
#
#   $DENV_VENV_DIR/py311  python3 (3.11)  maturin, inspect-ai, openenv-core, pytest
#   $DENV_VENV_DIR/py312  pyenv 3.12      maturin, harbor, inspect-ai, openenv-core, pytest
#   $DENV_VENV_DIR/py313  pyenv 3.13      maturin, inspect-ai, openenv-core, pytest
#   $DENV_VENV_DIR/vf     pyenv 3.12      verifiers 0.2.1 + prime-sandboxes 0.2.36 (SandboxEnv builds
#                                         its request with a string start_command, which
#                                         prime-sandboxes 0.2.37+ refuses)
#   $DENV_VENV_DIR/hud    pyenv 3.12      hud 0.6.21 (published as hud-python before 0.6.10)
# (vf and hud have their own venvs: their pins conflict with Harbor's and each other's.)
# ($DENV_VENV_DIR defaults to /var/cache/denv/venvs.) A venv with a constraints file
# beside this script (constraints-<name>.txt, exact versions) is installed with it.
#
# Idempotent: a venv whose stamp file matches the requirement list (and the constraints
# file's hash) is left alone.
# Versions resolved by pip are written to e2e/.work/venvs/<name>/versions.txt.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# Outside the work tree, so a fresh clone on the same machine reuses them.
venvs="${DENV_VENV_DIR:-/var/cache/denv/venvs}"
mkdir -p "$venvs"

find_python() {
  local minor="$1"
  local cand
  for cand in /root/.pyenv/versions/3."$minor".*/bin/python3 "$(command -v python3."$minor" || true)" "$(command -v python3 || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] || continue
    if "$cand" -c "import sys; sys.exit(0 if sys.version_info[:2]==(3,$minor) else 1)" 2>/dev/null; then
      echo "$cand"; return 0
    fi
  done
  return 1
}

base_pkgs=(maturin pytest pyyaml "inspect-ai" "openenv-core")

make_venv() {
  local name="$1" minor="$2"; shift 2
  local pkgs=("${base_pkgs[@]}" "$@")
  if [ "${NO_BASE:-0}" = 1 ]; then pkgs=("$@"); fi
  local dir="$venvs/$name"
  local constraints="$here/constraints-$name.txt" cflag=()
  [ -f "$constraints" ] && cflag=(-c "$constraints")
  local want; want="$(printf '%s\n' "${pkgs[@]}"; if [ -f "$constraints" ]; then sha256sum <"$constraints"; fi)"
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$want" ] && [ -x "$dir/bin/python" ]; then
    echo "setup: $name up to date"
    return 0
  fi
  local py
  if ! py="$(find_python "$minor")"; then
    echo "setup: no python 3.$minor found for $name (Harbor needs 3.12: install it, e.g. with pyenv)" >&2
    return 1
  fi
  echo "setup: creating $name from $py"
  rm -rf "$dir"
  "$py" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  echo "setup: pip install ${pkgs[*]} into $name (a few minutes the first time)"
  "$dir/bin/python" -m pip install --progress-bar off "${cflag[@]}" "${pkgs[@]}" 2>&1 | grep -vE '^ *(Using cached|Downloading|Requirement already)' | sed 's/^/  /'
  "$dir/bin/python" -c "${CHECK_IMPORT:-import inspect_ai, openenv}" || { echo "setup: $name is incomplete" >&2; return 1; }
  "$dir/bin/python" -m pip freeze > "$dir/versions.txt"
  printf '%s\n' "$want" > "$dir/.stamp"
}

# setup.sh [py311|py312|py313|vf|hud ...]: only the named venvs (default all five).
want_venvs=("$@"); [ ${#want_venvs[@]} -gt 0 ] || want_venvs=(py311 py312 py313 vf hud)
for name in "${want_venvs[@]}"; do
  case "$name" in
    py311) make_venv py311 11 ;;
    py312) make_venv py312 12 harbor ;;
    py313) make_venv py313 13 ;;
    vf) NO_BASE=1 CHECK_IMPORT="import verifiers as vf; vf.SandboxEnv" make_venv vf 12 pyyaml "verifiers==0.2.1" "prime-sandboxes==0.2.36" ;;
    hud) NO_BASE=1 CHECK_IMPORT="import hud.eval.runtime" make_venv hud 12 pyyaml "hud==0.6.21" ;;
    *) echo "setup: unknown venv $name" >&2; exit 2 ;;
  esac
done

for v in "$venvs"/py3* "$venvs"/vf "$venvs"/hud; do
  [ -f "$v/versions.txt" ] || continue
  echo "$(basename "$v"): $(grep -i -E '^(harbor|inspect.ai|openenv.core|maturin|verifiers|hud)==' "$v/versions.txt" | tr '\n' ' ')"
done
