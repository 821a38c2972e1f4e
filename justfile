# denv: the one entry point for humans and CI.
# Fresh Debian machine: `./e2e/setup-host.sh` installs what the recipes need (Docker
# engine, local images, just, PostgreSQL, btrfs-progs) and starts dockerd.

set shell := ["bash", "-euo", "pipefail", "-c"]

# The quickstart (spec/01-quickstart.md) end to end on the local Docker engine.
demo: build
    bash e2e/demo.sh

# Same, on btrfs storage (loop-mounted image file).
demo-btrfs: build
    bash e2e/demo.sh --btrfs

build:
    cargo build --workspace --bins

# fmt, clippy -D warnings
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# Unit and integration tests (real SQLite, real PostgreSQL, real Docker).
unit:
    #!/usr/bin/env bash
    set -euo pipefail
    pgdir="$(mktemp -d /tmp/denv-pg.XXXXXX)"; rmdir "$pgdir"
    export DENV_TEST_POSTGRES_DSN="$(bash e2e/lib/postgres.sh start "$pgdir")"
    trap 'bash e2e/lib/postgres.sh stop "$pgdir"' EXIT
    cargo build --workspace --bins
    # --include-ignored: the tests that need Docker and the built binaries run here too.
    cargo test --workspace --no-fail-fast -- --include-ignored

# End-to-end suite: real denv-cp + denvd + Docker driven by the CLI, on dir and btrfs.
e2e: build
    bash e2e/run.sh

# Python package + framework conformance (Harbor, Inspect, OpenEnv) against a real stack.
conformance: build
    bash e2e/python/run.sh

# The whole test suite (what CI runs).
test: lint unit e2e conformance

# Benchmarks: sandbox create vs docker run, fork vs dataset size, frozen window, verify, 16 forks.
bench: build
    bash e2e/bench/run.sh
