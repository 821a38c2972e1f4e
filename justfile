# denv: the one entry point for humans and CI.
# Fresh Debian machine: `./e2e/setup-host.sh` installs what the recipes need (Docker
# engine, the local stand-in images, just, PostgreSQL, btrfs-progs, zfs-fuse) and starts
# dockerd. Each test tier ends with a plain `<tier>: N passed, N failed` line.

set shell := ["bash", "-euo", "pipefail", "-c"]

# The quickstart (docs/quickstart.md) end to end on the local Docker engine.
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
    @echo "lint: 2 passed, 0 failed"

# Unit and integration tests on real parts: SQLite and a throwaway PostgreSQL, the
# Docker engine, btrfs on a loop device, a zfs-fuse pool. The tests that need Docker,
# PostgreSQL or zfs are #[ignore]d for a plain `cargo test`; here they all run.
unit:
    #!/usr/bin/env bash
    set -euo pipefail
    pgdir="$(mktemp -d /tmp/denv-pg.XXXXXX)"; rmdir "$pgdir"
    export DENV_TEST_POSTGRES_DSN="$(bash e2e/lib/postgres.sh start "$pgdir")"
    trap 'bash e2e/lib/postgres.sh stop "$pgdir"' EXIT
    bash e2e/lib/zfs.sh create denvunit 2G >/dev/null
    export DENV_TEST_ZFS_POOL=denvunit
    cargo build --workspace --bins
    log="$(mktemp /tmp/denv-unit.XXXXXX.log)"
    rc=0
    cargo test --workspace --no-fail-fast -- --include-ignored 2>&1 | tee "$log" || rc=$?
    # The network policy again on the iptables backend (chains instead of nftables).
    DENV_PACKET_FILTER=iptables cargo test --workspace --test runtime_egress --test runtime_engine_restart \
        -- --include-ignored 2>&1 | tee -a "$log" || rc=$?
    bash e2e/lib/cargo-summary.sh unit "$log"
    rm -f "$log"
    exit "$rc"

# End-to-end suite: real denv-cp + denvd + Docker driven by the CLI, every case on every
# storage backend (dir, btrfs, zfs), the three backends at the same time.
e2e: build
    E2E_PARALLEL="${E2E_PARALLEL:-1}" bash e2e/run.sh

# The Python package's unit tests, then framework conformance (Harbor, Inspect,
# OpenEnv) against a real stack.
python: build
    bash e2e/python/run.sh

conformance: python

# The whole test suite (what CI runs): every tier even when one fails, then a summary.
test:
    bash e2e/test-all.sh

# Benchmarks (release build): quickstart fork vs docker by hand, 10 execs vs docker exec, sandbox create vs docker run, fork vs dataset size, frozen window, verify, 16 forks.
bench:
    cargo build --release --workspace --bins
    DENV_BIN_DIR=target/release bash e2e/bench/run.sh
