# denv: the one entry point for humans and CI.
# Fresh Debian machine: `./e2e/setup-host.sh` installs what the recipes need (Docker
# engine, the local stand-in images, just, PostgreSQL, btrfs-progs, zfs-fuse, helm) and starts
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

# What `just test` runs as its lint tier: fmt, then one compile that serves both lint
# and the tests. The workspace's crates go through clippy's driver (rustc plus clippy's
# lints, warnings denied: the same lints as `just lint`), with the environment
# e2e/test-all.sh exports, so `cargo test` and the e2e and python builds reuse these
# artifacts instead of compiling everything a second time.
lint-build:
    #!/usr/bin/env bash
    set -euo pipefail
    [ -n "${RUSTC_WORKSPACE_WRAPPER:-}" ] || { echo "lint-build: run it from e2e/test-all.sh (it sets RUSTC_WORKSPACE_WRAPPER)" >&2; exit 2; }
    cargo fmt --all -- --check
    cargo test --workspace --all-targets --no-run
    cargo build --workspace --bins
    echo "lint: 2 passed, 0 failed"

# Unit and integration tests on real parts: SQLite and a throwaway PostgreSQL, the
# Docker engine, btrfs on a loop device, a zfs-fuse pool; and the Helm chart's tests. The tests that need Docker,
# PostgreSQL or zfs are #[ignore]d for a plain `cargo test`; here they all run.
unit:
    #!/usr/bin/env bash
    set -euo pipefail
    # The Helm chart first (seconds; its own `helm: N passed, N failed` line): a failure
    # there fails the tier too.
    helm_rc=0
    bash helm/test.sh || helm_rc=$?
    pgdir="$(mktemp -d /tmp/denv-pg.XXXXXX)"; rmdir "$pgdir"
    export DENV_TEST_POSTGRES_DSN="$(bash e2e/lib/postgres.sh start "$pgdir")"
    trap 'bash e2e/lib/postgres.sh stop "$pgdir"' EXIT
    bash e2e/lib/zfs.sh create denvunit 2G >/dev/null
    export DENV_TEST_ZFS_POOL=denvunit
    # Mounted once here: the tests' processes would otherwise race to make it.
    bash e2e/lib/btrfs.sh mount /var/lib/denv-test-btrfs 8G >/dev/null
    cargo build --workspace --bins
    log="$(mktemp /tmp/denv-unit.XXXXXX.log)"
    rc=0
    engine='binary(runtime_engine_restart)'
    if cargo nextest --version >/dev/null 2>&1; then
        # Every test in its own process, the binaries side by side (.config/nextest.toml:
        # three at a time, zfs ones one at a time, a hung test stopped after 10 minutes
        # and named). The tests that run a private engine go last, one at a time.
        run() { cargo nextest run --workspace --no-fail-fast --run-ignored all "$@"; }
        run -E "not $engine" 2>&1 | tee "$log" || rc=$?
        run -E "$engine" -j 1 2>&1 | tee -a "$log" || rc=$?
        cargo test --workspace --doc 2>&1 | tee -a "$log" || rc=$?
        # The network policy again on the iptables backend (chains instead of nftables).
        DENV_PACKET_FILTER=iptables run -E 'binary(runtime_egress)' 2>&1 | tee -a "$log" || rc=$?
        DENV_PACKET_FILTER=iptables run -E "$engine" -j 1 2>&1 | tee -a "$log" || rc=$?
    else
        echo "unit: cargo-nextest not found; running the test binaries one after another with cargo test"
        cargo test --workspace --no-fail-fast -- --include-ignored 2>&1 | tee "$log" || rc=$?
        DENV_PACKET_FILTER=iptables cargo test --workspace --test runtime_egress --test runtime_engine_restart \
            -- --include-ignored 2>&1 | tee -a "$log" || rc=$?
    fi
    bash e2e/lib/cargo-summary.sh unit "$log"
    rm -f "$log"
    [ "$rc" -ne 0 ] || rc=$helm_rc
    exit "$rc"

# helm and the validator come from PyPI (e2e/lib/helm-tools.sh). Part of `unit`.
# The Helm chart's tests: helm template, every manifest against the Kubernetes schemas, bad values refused.
helm:
    bash helm/test.sh

# End-to-end suite: real denv-cp + denvd + Docker driven by the CLI, every case on every
# storage backend (dir, btrfs, zfs), the three backends at the same time.
# Then the fleet test: two control-plane replicas on PostgreSQL behind a balancer, three
# hosts (dir, btrfs, zfs), all over TLS (e2e/fleet/run.sh).
e2e: build
    #!/usr/bin/env bash
    set -uo pipefail
    rc=0
    E2E_PARALLEL="${E2E_PARALLEL:-1}" bash e2e/run.sh || rc=$?
    bash e2e/fleet/run.sh || rc=$?
    exit "$rc"

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
