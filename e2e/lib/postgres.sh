#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests (Debian's `postgresql` package), owned by
# the `postgres` user, listening on 127.0.0.1 only, data and socket under /tmp.
#
#   e2e/lib/postgres.sh start [DIR]   # prints the DSN on stdout; DIR default /tmp/denv-pg-<port>
#   e2e/lib/postgres.sh stop  DIR     # stops the cluster and deletes DIR
#
#   export DENV_TEST_POSTGRES_DSN=$(e2e/lib/postgres.sh start /tmp/denv-pg)
#   cargo test -p denv-cp
#   e2e/lib/postgres.sh stop /tmp/denv-pg
#
# The DSN is postgres://denv:denv@127.0.0.1:<port>/denv?sslmode=disable. The port is a
# free one picked at start. Needs root (to run initdb/pg_ctl as postgres).
set -euo pipefail

_pg_log() { printf '[%s] postgres: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

pg_bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)
    [ -n "$d" ] && [ -x "$d/initdb" ] || { _pg_log "no /usr/lib/postgresql/*/bin/initdb: apt-get install postgresql"; return 1; }
    echo "$d"
}

pg_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

as_pg() { runuser -u postgres -- "$@"; }

pg_start() {
    local bin port dir
    bin=$(pg_bindir)
    port=$(pg_free_port)
    dir=${1:-/tmp/denv-pg-$port}
    if [ -f "$dir/port" ] && as_pg "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        port=$(cat "$dir/port")
        echo "postgres://denv:denv@127.0.0.1:$port/denv?sslmode=disable"
        return 0
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    chown postgres: "$dir"
    as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; return 1; }
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >&2 \
        || { cat "$dir/server.log" >&2; return 1; }
    echo "$port" >"$dir/port"
    as_pg "$bin/psql" -h "$dir" -p "$port" -U postgres -v ON_ERROR_STOP=1 -q \
        -c "create role denv login password 'denv' createdb" \
        -c "create database denv owner denv" >&2
    _pg_log "cluster in $dir on 127.0.0.1:$port"
    echo "postgres://denv:denv@127.0.0.1:$port/denv?sslmode=disable"
}

pg_stop() {
    local bin dir=${1:?usage: postgres.sh stop DIR}
    bin=$(pg_bindir)
    if [ -d "$dir/data" ]; then
        as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    fi
    rm -rf "$dir"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    case "${1:-}" in
        start) shift; pg_start "$@" ;;
        stop) shift; pg_stop "$@" ;;
        *) echo "usage: $0 start [DIR] | stop DIR" >&2; exit 2 ;;
    esac
fi
