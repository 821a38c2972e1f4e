#!/usr/bin/env bash
# Entrypoint of the local postgres:16-alpine stand-in. Behaves like the official
# image's: as root it fixes ownership of $PGDATA and re-executes itself as
# postgres; on an empty $PGDATA it runs initdb (superuser $POSTGRES_USER,
# password $POSTGRES_PASSWORD, trust on the local socket, scram-sha-256 for
# host connections, listen on *), runs /docker-entrypoint-initdb.d/*, and then
# execs postgres in the foreground. A data directory that already has
# PG_VERSION (a restart, or a copied snapshot) is started as is.
set -Eeo pipefail

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "${1:0:1}" = '-' ]; then
    set -- postgres "$@"
fi

if [ "$1" != postgres ]; then
    exec "$@"
fi

if [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    # Only touch what is not ours yet: a big restored data dir stays cheap.
    find "$PGDATA" \! -user postgres -exec chown postgres:postgres '{}' +
    chmod 0700 "$PGDATA"
    chown postgres:postgres /var/run/postgresql
    chmod 2777 /var/run/postgresql
    exec gosu postgres "${BASH_SOURCE[0]}" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_USER:=postgres}"
    : "${POSTGRES_DB:=$POSTGRES_USER}"
    auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
        cat >&2 <<'MSG'
Error: Database is uninitialized and superuser password is not specified.
       You must specify POSTGRES_PASSWORD to a non-empty value for the
       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".
       Or set POSTGRES_HOST_AUTH_METHOD=trust to allow all connections without
       a password (not recommended).
MSG
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    # shellcheck disable=SC2086
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host="$auth" ${POSTGRES_INITDB_ARGS:-} -D "$PGDATA"
    rm -f "$pwfile"
    printf '\nhost all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"
    printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"

    # Create the database and run init scripts on a socket-only server.
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    for f in /docker-entrypoint-initdb.d/*; do
        case "$f" in
            *.sh)
                echo "running $f"
                # shellcheck disable=SC1090
                . "$f"
                ;;
            *.sql) echo "running $f"; psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$f" ;;
            *.sql.gz) echo "running $f"; gunzip -c "$f" | psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" ;;
            *) ;;
        esac
    done
    pg_ctl -D "$PGDATA" -m fast -w stop
    echo 'PostgreSQL init process complete; ready for start up.'
fi

exec "$@"
