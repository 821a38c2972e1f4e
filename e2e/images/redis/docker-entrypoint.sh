#!/bin/sh
# Entrypoint of the local redis:7-alpine stand-in. Like the official image:
# `redis-server` (or a leading option) runs as the redis user in /data, with
# protected mode off unless the arguments set it.
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = redis-server ]; then
    case " $* " in
        *protected-mode*) ;;
        *) set -- "$@" --protected-mode no ;;
    esac
    if [ "$(id -u)" = 0 ]; then
        find . \! -user redis -exec chown redis '{}' +
        exec gosu redis "$0" "$@"
    fi
fi
exec "$@"
