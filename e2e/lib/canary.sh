#!/usr/bin/env bash
# An egress canary on the host's side of the Docker bridges: an HTTP server in
# its own network namespace, behind a veth pair, at an address outside every
# Docker network (default 198.18.255.2, benchmark range RFC 2544). It answers
# `GET /` with the body "canary".
#
# Why: this machine has no internet, and an HTTP interceptor answers
# http://1.1.1.1/ with 404 whether or not egress is allowed, so "wget failed"
# proves nothing. The canary is a target that IS reachable from a container on
# a normal (egress-allowed) bridge network, because traffic to it is forwarded
# like traffic to the internet, and is NOT reachable from an `internal: true`
# network. (A server listening on the host itself is no canary: containers on
# an internal network still reach the host's own addresses, e.g. the bridge
# gateway or eth0's address, through INPUT.)
#
#   e2e/lib/canary.sh up   [NAME] [IP]   # prints the canary URL; idempotent
#   e2e/lib/canary.sh down [NAME]
#   e2e/lib/canary.sh url  [NAME]        # prints the URL if the canary is up
#
# NAME defaults to denv-canary (netns name; the veth is NAME-h/NAME-c cut to
# 15 characters). IP must be the second address of a /30 (the host side gets
# the first). Needs root and iproute2.
set -euo pipefail

name=${2:-denv-canary}
cmd=${1:-}
ip_c=${3:-198.18.255.2}
state=/run/$name
veth_h=$(printf '%.13s' "$name")-h
veth_c=$(printf '%.13s' "$name")-c

host_ip() { # a.b.c.d -> a.b.c.(d-1)
    local IFS=.
    # shellcheck disable=SC2086
    set -- $1
    echo "$1.$2.$3.$(($4 - 1))"
}

server_cmd() {
    local bb
    bb=$(ls /var/cache/denv-images/busybox-*-static 2>/dev/null | head -1 || true)
    if [ -n "$bb" ]; then
        echo "$bb httpd -f -p 80 -h $state/www"
    else
        echo "python3 -m http.server 80 --bind 0.0.0.0 --directory $state/www"
    fi
}

is_up() {
    [ -f "$state/pid" ] && kill -0 "$(cat "$state/pid")" 2>/dev/null &&
        ip netns list | grep -qw "$name"
}

up() {
    if is_up; then
        echo "http://$(cat "$state/ip")/"
        return
    fi
    down >/dev/null 2>&1 || true
    mkdir -p "$state/www"
    echo canary >"$state/www/index.html"
    local ip_h
    ip_h=$(host_ip "$ip_c")
    ip netns add "$name"
    ip link add "$veth_h" type veth peer name "$veth_c"
    ip link set "$veth_c" netns "$name"
    ip addr add "$ip_h/30" dev "$veth_h"
    ip link set "$veth_h" up
    ip netns exec "$name" ip link set lo up
    ip netns exec "$name" ip addr add "$ip_c/30" dev "$veth_c"
    ip netns exec "$name" ip link set "$veth_c" up
    ip netns exec "$name" ip route add default via "$ip_h"
    # shellcheck disable=SC2046
    setsid ip netns exec "$name" $(server_cmd) >"$state/server.log" 2>&1 </dev/null &
    echo $! >"$state/pid"
    echo "$ip_c" >"$state/ip"
    local _
    for _ in $(seq 1 50); do
        if ip netns exec "$name" bash -c "exec 3<>/dev/tcp/127.0.0.1/80" 2>/dev/null; then
            echo "http://$ip_c/"
            return
        fi
        sleep 0.1
    done
    echo "canary: server did not start (see $state/server.log)" >&2
    return 1
}

down() {
    if [ -f "$state/pid" ]; then
        kill "$(cat "$state/pid")" 2>/dev/null || true
    fi
    ip netns pids "$name" 2>/dev/null | xargs -r kill 2>/dev/null || true
    ip link del "$veth_h" 2>/dev/null || true
    ip netns del "$name" 2>/dev/null || true
    rm -rf "$state"
}

case "$cmd" in
    up) up ;;
    down) down ;;
    url) is_up && echo "http://$(cat "$state/ip")/" ;;
    *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
