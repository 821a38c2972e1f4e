# shellcheck shell=bash
# The `denv` Python package of this tree for e2e cases (sourced by a case; needs
# lib/stack.sh's REPO_ROOT, cargo and python3 >= 3.11): the package's Python files and
# its native module, built by cargo as maturin builds it (`--features
# pyo3/extension-module`, the workspace's debug profile, so it shares the e2e build's
# artifacts), in a directory of its own. No venv and no pip: the client needs only the
# standard library.
#
#   py_denv_make DIR   DIR/denv, the package (builds the native module when needed)
#   py_denv DIR ARGS   python3 ARGS with DIR first on PYTHONPATH

py_denv_make() {
  local d="$1" target="${CARGO_TARGET_DIR:-$REPO_ROOT/target}"
  (cd "$REPO_ROOT" && cargo build -q -p denv-python --lib --features pyo3/extension-module) ||
    { echo "py_denv_make: cargo could not build the native module"; return 1; }
  mkdir -p "$d"
  cp -r "$REPO_ROOT/bindings/python/python/denv" "$d/"
  cp "$target/debug/lib_native.so" "$d/denv/_native.abi3.so"
}

py_denv() {
  local d="$1"; shift
  PYTHONPATH="$d${PYTHONPATH:+:$PYTHONPATH}" python3 "$@"
}
