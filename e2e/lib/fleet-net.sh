#!/usr/bin/env bash
# A fleet of "machines" on this one box, for end-to-end tests: each host is a
# network namespace with its own Docker engine (own data root, exec root,
# socket, pid file, bridges and packet filter), and all hosts hang off one
# virtual link, so traffic between hosts, and from a host to the control plane
# in the root namespace, crosses a real (veth + bridge) link that can be cut
# or slowed. Run it or source it.
#
#   e2e/lib/fleet-net.sh up NAME IDX [--images "IMG..."]  # prints DOCKER_HOST=unix://...
#   e2e/lib/fleet-net.sh down NAME                       # engine, containers, ns, veth, data: gone
#   e2e/lib/fleet-net.sh down-all                        # every host (another run's too), then the bridge
#                                                        # and its rules unless a socket is on 10.231.0.1
#   e2e/lib/fleet-net.sh engine-stop NAME [--kill]       # SIGTERM (KILL after $FLEET_STOP_TIMEOUT s); --kill: crash
#   e2e/lib/fleet-net.sh engine-start NAME               # the engine again, same data
#   e2e/lib/fleet-net.sh link-cut NAME | link-restore NAME
#   e2e/lib/fleet-net.sh link-slow NAME DELAY_MS RATE_MBIT | link-clear NAME
#   e2e/lib/fleet-net.sh exec NAME CMD...                # CMD in the host's netns, DOCKER_HOST set
#   e2e/lib/fleet-net.sh images NAME IMG...              # copy images from the main engine
#   e2e/lib/fleet-net.sh status                          # hosts, engine pids, addresses, link state
#
# The link: bridge denvfleet0 = 10.231.0.1/24 in the root namespace (where the
# control plane listens); host IDX (1..200) is 10.231.0.(10+IDX) on eth0 of
# netns dfleet-NAME, default route via 10.231.0.1; its veth's root side is
# dfv-NAME (so NAME is at most 11 characters: [a-z0-9-]). IPv6 is off on the
# link. Rules in the root namespace (iptables chains DENV-FLEET and
# DENV-FLEET-IN) let hosts reach each other and 10.231.0.1, and nothing else:
# nothing from the link is forwarded anywhere (no other private or public
# address is ever reached from a host, DNS included: the engines are given
# 10.231.0.1 as their containers' DNS server, where nothing answers).
#
# Per host: /run/denv-fleet/NAME/{docker.sock,docker.pid,daemon.json,exec/},
# /var/lib/denv-fleet/NAME/docker (data root), log /var/log/denv-fleet-NAME.log.
# The engine (dockerd, its containerd, the shims) runs in the cgroup
# denv-fleet/NAME/engine of the pids hierarchy and its containers under the
# cgroup parent /denv-fleet/NAME/containers, so nothing of a host survives its
# `down` or `engine-stop` unnoticed.
#
# Sourced, it defines fleet_up, fleet_down, fleet_down_all, fleet_engine_stop,
# fleet_engine_start, fleet_link_cut, fleet_link_restore, fleet_link_slow,
# fleet_link_clear, fleet_exec, fleet_images, fleet_status, fleet_sock,
# fleet_ip, fleet_hosts; they return non-zero with an `error:` line on failure.
# Needs root, iproute2 (ip, tc), util-linux (nsenter, unshare), iptables and
# dockerd (e2e/setup-host.sh installs them).

FLEET_BRIDGE=denvfleet0
FLEET_PREFIX=10.231.0
FLEET_GW=10.231.0.1
FLEET_RUN=/run/denv-fleet
FLEET_LIB=/var/lib/denv-fleet
FLEET_STOP_TIMEOUT=${FLEET_STOP_TIMEOUT:-20}
FLEET_LIB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

_fleet_log() { printf '[%s] fleet-net: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
_fleet_err() { _fleet_log "error: $*"; return 1; }

# Paths and names of one host.
fleet_ns() { echo "dfleet-$1"; }
fleet_sock() { echo "$FLEET_RUN/$1/docker.sock"; }
_fleet_veth() { echo "dfv-$1"; }
_fleet_dir() { echo "$FLEET_RUN/$1"; }
_fleet_root() { echo "$FLEET_LIB/$1"; }
_fleet_log_file() { echo "/var/log/denv-fleet-$1.log"; }
_fleet_docker() { local n=$1; shift; docker -H "unix://$(fleet_sock "$n")" "$@"; }
# fleet_ip NAME — the host's address (from its saved index).
fleet_ip() {
    local idx
    idx=$(cat "$(_fleet_dir "$1")/idx" 2>/dev/null) || { _fleet_err "no fleet host $1"; return 1; }
    echo "$FLEET_PREFIX.$((10 + idx))"
}

_fleet_check_name() {
    [[ "${1:-}" =~ ^[a-z0-9][a-z0-9-]{0,10}$ ]] ||
        _fleet_err "host name '${1:-}' must be 1-11 characters of [a-z0-9-] (it becomes the veth name dfv-NAME, at most 15)"
}

_fleet_need() {
    [ "$(id -u)" = 0 ] || { _fleet_err "run as root"; return 1; }
    local c
    for c in ip tc nsenter unshare iptables dockerd docker findmnt; do
        command -v "$c" >/dev/null 2>&1 || { _fleet_err "$c not found (e2e/setup-host.sh installs it)"; return 1; }
    done
}

# The cgroup directories the host uses, one per line: the engine's (pids hierarchy,
# or the unified one on a cgroup v2 machine) and its containers' parent in every
# hierarchy. Directories that do not exist are listed too.
_fleet_cg_engine() {
    if [ -d /sys/fs/cgroup/pids ] && [ -f /sys/fs/cgroup/pids/cgroup.procs ]; then
        echo "/sys/fs/cgroup/pids/denv-fleet/$1/engine"
    elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        echo "/sys/fs/cgroup/denv-fleet/$1/engine"
    fi
}
_fleet_cg_all() { # every denv-fleet/NAME directory, deepest first
    local d
    for d in /sys/fs/cgroup/*/denv-fleet/"$1" /sys/fs/cgroup/denv-fleet/"$1"; do
        [ -d "$d" ] && find "$d" -depth -type d
    done
}
# Pids in the host's cgroups (engine and containers).
_fleet_cg_pids() {
    local d
    _fleet_cg_all "$1" | while read -r d; do cat "$d/cgroup.procs" 2>/dev/null; done | sort -un
}
# Pids whose network namespace is the host's.
_fleet_ns_pids() {
    local ns
    ns=$(fleet_ns "$1")
    [ -e "/run/netns/$ns" ] || return 0
    ip netns pids "$ns" 2>/dev/null
    return 0
}

# _fleet_kill_pids WHAT GRACE PIDS... — SIGTERM, then SIGKILL what is left after GRACE s
# (GRACE 0: SIGKILL at once).
_fleet_kill_pids() {
    local what=$1 grace=$2 p left i
    shift 2
    [ $# -gt 0 ] || return 0
    if [ "$grace" = 0 ]; then kill -KILL "$@" 2>/dev/null; return 0; fi
    kill -TERM "$@" 2>/dev/null
    for i in $(seq 1 $((grace * 10))); do
        left=()
        for p in "$@"; do kill -0 "$p" 2>/dev/null && left+=("$p"); done
        [ "${#left[@]}" -eq 0 ] && return 0
        sleep 0.1
    done
    _fleet_log "$what: SIGKILL to ${left[*]} (still there ${grace}s after SIGTERM)"
    kill -KILL "${left[@]}" 2>/dev/null
    return 0
}

# --- the link -------------------------------------------------------------------------

# _fleet_ipt_rule CHAIN RULE... — append RULE to CHAIN unless it is there.
_fleet_ipt_rule() {
    local chain=$1
    shift
    iptables -w -C "$chain" "$@" 2>/dev/null || iptables -w -A "$chain" "$@"
}

# fleet_net_up — the bridge and its rules (idempotent).
fleet_net_up() {
    if ! ip link show "$FLEET_BRIDGE" >/dev/null 2>&1; then
        ip link add "$FLEET_BRIDGE" type bridge stp_state 0 forward_delay 0 ||
            { _fleet_err "could not create bridge $FLEET_BRIDGE"; return 1; }
        _fleet_log "created bridge $FLEET_BRIDGE ($FLEET_GW/24)"
    fi
    sysctl -qw "net.ipv6.conf.$FLEET_BRIDGE.disable_ipv6=1" 2>/dev/null || true
    ip -o addr show dev "$FLEET_BRIDGE" | grep -q " $FLEET_GW/24 " ||
        ip addr add "$FLEET_GW/24" dev "$FLEET_BRIDGE" || { _fleet_err "could not address $FLEET_BRIDGE"; return 1; }
    ip link set "$FLEET_BRIDGE" up
    # Forwarding: Docker's FORWARD policy is DROP and br_netfilter hands bridged frames
    # to it, so host-to-host traffic over the bridge is accepted explicitly; anything
    # from the link to elsewhere (or from elsewhere into the link) is rejected at once.
    iptables -w -N DENV-FLEET 2>/dev/null || true
    _fleet_ipt_rule DENV-FLEET -i "$FLEET_BRIDGE" -o "$FLEET_BRIDGE" -j ACCEPT
    _fleet_ipt_rule DENV-FLEET -i "$FLEET_BRIDGE" -j REJECT --reject-with icmp-admin-prohibited
    _fleet_ipt_rule DENV-FLEET -o "$FLEET_BRIDGE" -j REJECT --reject-with icmp-admin-prohibited
    iptables -w -C FORWARD -j DENV-FLEET 2>/dev/null || iptables -w -I FORWARD 1 -j DENV-FLEET
    # Input: from the link, only the control plane's address.
    iptables -w -N DENV-FLEET-IN 2>/dev/null || true
    _fleet_ipt_rule DENV-FLEET-IN -i "$FLEET_BRIDGE" -d "$FLEET_GW" -j ACCEPT
    _fleet_ipt_rule DENV-FLEET-IN -i "$FLEET_BRIDGE" -j REJECT --reject-with icmp-admin-prohibited
    iptables -w -C INPUT -j DENV-FLEET-IN 2>/dev/null || iptables -w -I INPUT 1 -j DENV-FLEET-IN
}

# fleet_net_down — remove the bridge and its rules: only when no host is left and no
# process has a socket on 10.231.0.1 (a control plane of another run still listening
# there would lose its address).
fleet_net_down() {
    local left users
    left=$(fleet_hosts)
    [ -z "$left" ] || { _fleet_err "bridge $FLEET_BRIDGE kept: hosts still up: $(echo $left)"; return 1; }
    users=$(ss -Htanp 2>/dev/null | awk -v a="$FLEET_GW:" 'index($4, a) == 1' | grep -o 'pid=[0-9]*' | sort -u | tr '\n' ' ')
    [ -z "$users" ] ||
        { _fleet_err "bridge $FLEET_BRIDGE kept: sockets on $FLEET_GW held by ${users}(stop them first)"; return 1; }
    while iptables -w -D FORWARD -j DENV-FLEET 2>/dev/null; do :; done
    while iptables -w -D INPUT -j DENV-FLEET-IN 2>/dev/null; do :; done
    iptables -w -F DENV-FLEET 2>/dev/null && iptables -w -X DENV-FLEET 2>/dev/null
    iptables -w -F DENV-FLEET-IN 2>/dev/null && iptables -w -X DENV-FLEET-IN 2>/dev/null
    if ip link show "$FLEET_BRIDGE" >/dev/null 2>&1; then
        ip link del "$FLEET_BRIDGE" && _fleet_log "removed bridge $FLEET_BRIDGE"
    fi
    rmdir "$FLEET_RUN" "$FLEET_LIB" 2>/dev/null
    local d
    for d in /sys/fs/cgroup/*/denv-fleet /sys/fs/cgroup/denv-fleet; do [ -d "$d" ] && rmdir "$d" 2>/dev/null; done
    return 0
}

# fleet_hosts — names of every host with anything left: state directory, netns, veth.
fleet_hosts() {
    {
        local d
        for d in "$FLEET_RUN"/*/; do [ -d "$d" ] && basename "$d"; done
        ip netns list 2>/dev/null | awk '{print $1}' | sed -n 's/^dfleet-//p'
        ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed -n 's/@.*//; s/^dfv-//p'
    } | sort -u
}

# --- one host ---------------------------------------------------------------------

_fleet_engine_pid() {
    local p
    p=$(cat "$(_fleet_dir "$1")/docker.pid" 2>/dev/null) || return 1
    [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = dockerd ] && echo "$p"
}
_fleet_engine_ready() { _fleet_docker "$1" info >/dev/null 2>&1; }

_fleet_write_config() {
    local n=$1 driver
    driver=$(docker info -f '{{.Driver}}' 2>/dev/null || true)
    # Pools as e2e/setup-host.sh writes them for the main engine (denvd makes one network
    # per environment); the storage driver of the main engine when it is overlay2.
    cat >"$(_fleet_dir "$n")/daemon.json" <<J
{
  "default-address-pools": [
    { "base": "172.17.0.0/16", "size": 16 },
    { "base": "172.18.0.0/15", "size": 24 },
    { "base": "172.20.0.0/14", "size": 24 },
    { "base": "172.24.0.0/13", "size": 24 }
  ],$( [ "$driver" = overlay2 ] && printf '\n  "storage-driver": "overlay2",' )
  "dns": ["$FLEET_GW"],
  "cgroup-parent": "/denv-fleet/$n/containers"
}
J
}

# fleet_engine_start NAME — start the host's engine (idempotent) and wait until it answers.
fleet_engine_start() {
    local n=${1:?usage: fleet_engine_start NAME}
    _fleet_check_name "$n" || return 1
    local dir ns log
    dir=$(_fleet_dir "$n")
    ns=$(fleet_ns "$n")
    log=$(_fleet_log_file "$n")
    [ -f "$dir/idx" ] && [ -e "/run/netns/$ns" ] || { _fleet_err "no fleet host $n (run: up $n IDX)"; return 1; }
    if _fleet_engine_ready "$n"; then return 0; fi
    if _fleet_engine_pid "$n" >/dev/null; then
        _fleet_log "$n: engine running but not answering; waiting"
    else
        # Leftovers of an engine that was killed: its containerd and shims, and their
        # container processes (they would hold the socket and the state directory).
        local stale
        stale=$(_fleet_cg_pids "$n")
        if [ -n "$stale" ]; then
            _fleet_log "$n: stopping what a dead engine left: pids $(echo $stale)"
            # shellcheck disable=SC2086
            _fleet_kill_pids "$n: leftovers" 5 $stale
        fi
        rm -f "$dir/docker.pid"
        # A containerd pid file naming a process that is gone, a zombie or no containerd
        # would make dockerd wait for that containerd instead of starting its own.
        local cpid
        cpid=$(cat "$dir/exec/containerd/containerd.pid" 2>/dev/null)
        if [ -n "$cpid" ] && { [ "$(cat "/proc/$cpid/comm" 2>/dev/null)" != containerd ] ||
            grep -q '^State:.*Z' "/proc/$cpid/status" 2>/dev/null; }; then
            rm -f "$dir/exec/containerd/containerd.pid"
        fi
        mkdir -p "$dir/exec" "$(_fleet_root "$n")/docker"
        [ -f "$dir/daemon.json" ] || _fleet_write_config "$n"
        local cg
        cg=$(_fleet_cg_engine "$n")
        [ -n "$cg" ] && mkdir -p "$cg"
        local offset
        offset=$(stat -c %s "$log" 2>/dev/null || echo 0)
        echo "--- $(date -u +%FT%TZ) fleet-net: engine-start $n" >>"$log"
        # nsenter --net only (not `ip netns exec`, which remounts /sys and hides the
        # cgroups). setsid: the engine outlives the caller. The shell first moves itself
        # into the engine's cgroup, so dockerd, its containerd and the shims are there.
        CG="$cg" setsid nohup nsenter --net="/run/netns/$ns" -- sh -c '
            [ -n "$CG" ] && echo $$ >"$CG/cgroup.procs"
            exec "$@"' sh \
            dockerd --config-file "$dir/daemon.json" \
            --data-root "$(_fleet_root "$n")/docker" --exec-root "$dir/exec" \
            -H "unix://$(fleet_sock "$n")" --pidfile "$dir/docker.pid" \
            >>"$log" 2>&1 </dev/null &
        local pid=$!
        disown "$pid" 2>/dev/null || true
    fi
    local i
    for i in $(seq 1 600); do
        _fleet_engine_ready "$n" && return 0
        if [ -n "${pid:-}" ] && ! kill -0 "$pid" 2>/dev/null; then
            tail -c +"$((offset + 1))" "$log" | tail -20 >&2
            _fleet_err "$n: dockerd exited before it answered (log: $log)"
            return 1
        fi
        sleep 0.1
    done
    tail -20 "$log" >&2
    _fleet_err "$n: the engine did not answer within 60 s (log: $log)"
}

# fleet_engine_stop NAME [--kill] — stop the host's engine: SIGTERM (dockerd stops its
# containers, then its containerd), SIGKILL after FLEET_STOP_TIMEOUT s; with --kill at
# once (a crash). Either way, whatever of the engine is still running afterwards
# (containerd, shims, container processes) is killed, so nothing is orphaned; the
# containers stay in the data root, exited, and `docker start` or their restart policy
# brings them back after engine-start.
fleet_engine_stop() {
    local n=${1:?usage: fleet_engine_stop NAME [--kill]} mode=${2:-}
    _fleet_check_name "$n" || return 1
    local pid all
    all=$(_fleet_cg_pids "$n")
    if pid=$(_fleet_engine_pid "$n"); then
        if [ "$mode" = --kill ]; then
            kill -KILL "$pid"
            _fleet_log "$n: SIGKILL to dockerd $pid"
        else
            _fleet_kill_pids "$n: dockerd" "$FLEET_STOP_TIMEOUT" "$pid"
        fi
        local i
        for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    # Its containerd, the shims and the containers' processes: after a graceful stop
    # there should be none; after --kill they die with it, as on a crashed machine.
    local rest
    rest=$(_fleet_cg_pids "$n")
    if [ -n "$rest" ]; then
        if [ "$mode" = --kill ]; then
            # shellcheck disable=SC2086
            _fleet_kill_pids "$n: engine leftovers" 0 $rest
        else
            _fleet_log "$n: engine left pids $(echo $rest); stopping them"
            # shellcheck disable=SC2086
            _fleet_kill_pids "$n: engine leftovers" 5 $rest
        fi
        local i
        for i in $(seq 1 50); do [ -z "$(_fleet_cg_pids "$n")" ] && break; sleep 0.1; done
    fi
    # Killed processes leave the cgroup at once but stay zombies until init reaps them
    # (here up to 2 s), and a zombie containerd named by exec/containerd/containerd.pid
    # counts as running for the next dockerd, which then waits for its socket and gives
    # up ("timeout waiting for containerd to start"): wait until they are gone.
    # shellcheck disable=SC2086
    _fleet_wait_gone 10 $all $rest
    rm -f "$(_fleet_dir "$n")/docker.pid"
    return 0
}

# _fleet_wait_gone SECONDS PIDS... — wait until none of PIDS exists (zombies included).
_fleet_wait_gone() {
    local secs=$1 i p left
    shift
    for i in $(seq 1 $((secs * 10))); do
        left=""
        for p in "$@"; do [ -e "/proc/$p" ] && left+=" $p"; done
        [ -z "$left" ] && return 0
        sleep 0.1
    done
    _fleet_log "still not reaped after ${secs}s:$left"
}

# fleet_images NAME IMG... — copy images the host's engine lacks from the main engine
# (docker save | docker load), timed.
fleet_images() {
    local n=${1:?usage: fleet_images NAME IMG...} img t0 t1 size
    shift
    for img in "$@"; do
        _fleet_docker "$n" image inspect "$img" >/dev/null 2>&1 && continue
        docker image inspect "$img" >/dev/null 2>&1 ||
            { _fleet_err "image $img is not in the main engine (e2e/setup-host.sh builds the stand-ins)"; return 1; }
        size=$(docker image inspect -f '{{.Size}}' "$img")
        t0=$(date +%s%N)
        docker save "$img" | _fleet_docker "$n" load -q >/dev/null
        [ "${PIPESTATUS[0]}${PIPESTATUS[1]}" = 00 ] || { _fleet_err "$n: copying $img failed"; return 1; }
        t1=$(date +%s%N)
        _fleet_log "$n: copied $img ($((size / 1000000)) MB) in $(((t1 - t0) / 1000000)) ms"
    done
}

# fleet_up NAME IDX [--images "IMG..."] — bring the host up (idempotent); prints
# DOCKER_HOST=unix://… for its engine.
fleet_up() {
    local n=${1:-} idx=${2:-} images=""
    shift 2 2>/dev/null || { _fleet_err "usage: up NAME IDX [--images \"IMG...\"]"; return 1; }
    while [ $# -gt 0 ]; do
        case "$1" in
            --images) images=${2:-}; shift 2 || { _fleet_err "--images needs a value"; return 1; } ;;
            --images=*) images=${1#--images=}; shift ;;
            *) _fleet_err "up: unknown argument $1"; return 1 ;;
        esac
    done
    _fleet_check_name "$n" || return 1
    [[ "$idx" =~ ^[0-9]+$ ]] && [ "$idx" -ge 1 ] && [ "$idx" -le 200 ] ||
        { _fleet_err "IDX must be 1..200 (the host gets $FLEET_PREFIX.(10+IDX)), not '$idx'"; return 1; }
    _fleet_need || return 1
    local dir ns veth addr t0
    t0=$(date +%s%N)
    dir=$(_fleet_dir "$n")
    ns=$(fleet_ns "$n")
    veth=$(_fleet_veth "$n")
    addr="$FLEET_PREFIX.$((10 + idx))"
    if [ -f "$dir/idx" ] && [ "$(cat "$dir/idx")" != "$idx" ]; then
        _fleet_err "host $n is up with IDX $(cat "$dir/idx"), not $idx (down it first)"; return 1
    fi
    local other
    for other in "$FLEET_RUN"/*/idx; do
        [ -f "$other" ] && [ "$other" != "$dir/idx" ] && [ "$(cat "$other")" = "$idx" ] &&
            { _fleet_err "IDX $idx ($addr) is taken by host $(basename "$(dirname "$other")")"; return 1; }
    done
    fleet_net_up || return 1
    mkdir -p "$dir/exec" "$(_fleet_root "$n")/docker"
    echo "$idx" >"$dir/idx"
    # Network namespace, veth (root side on the bridge, eth0 inside), address, route.
    [ -e "/run/netns/$ns" ] || ip netns add "$ns" || { _fleet_err "ip netns add $ns failed"; return 1; }
    local nsx=(nsenter --net="/run/netns/$ns" --)
    "${nsx[@]}" ip link set lo up
    if ! ip link show "$veth" >/dev/null 2>&1; then
        "${nsx[@]}" ip link del eth0 2>/dev/null || true
        ip link add "$veth" type veth peer name eth0 netns "$ns" ||
            { _fleet_err "could not create veth $veth"; return 1; }
    fi
    sysctl -qw "net.ipv6.conf.$veth.disable_ipv6=1" 2>/dev/null || true
    "${nsx[@]}" sysctl -qw net.ipv6.conf.eth0.disable_ipv6=1 2>/dev/null || true
    ip link set "$veth" master "$FLEET_BRIDGE" up
    "${nsx[@]}" ip -o addr show dev eth0 | grep -q " $addr/24 " || "${nsx[@]}" ip addr add "$addr/24" dev eth0
    "${nsx[@]}" ip link set eth0 up
    "${nsx[@]}" ip route replace default via "$FLEET_GW" dev eth0
    # The engine.
    [ -f "$dir/daemon.json" ] || _fleet_write_config "$n"
    local was_ready=0
    _fleet_engine_ready "$n" && was_ready=1
    fleet_engine_start "$n" || return 1
    [ "$was_ready" = 1 ] ||
        _fleet_log "$n: up at $addr, engine ready in $((($(date +%s%N) - t0) / 1000000)) ms (pid $(_fleet_engine_pid "$n"), log $(_fleet_log_file "$n"))"
    # shellcheck disable=SC2086
    [ -z "$images" ] || fleet_images "$n" $images || return 1
    echo "DOCKER_HOST=unix://$(fleet_sock "$n")"
}

_fleet_umount_under() { # unmount everything mounted under the given directories
    local d m tries
    for tries in 1 2 3; do
        local mounts=()
        for d in "$@"; do
            while read -r m; do [ -n "$m" ] && mounts+=("$m"); done < <(findmnt -rn -o TARGET | awk -v p="$d" 'index($0, p) == 1' | sort -r)
        done
        [ "${#mounts[@]}" -eq 0 ] && return 0
        for m in "${mounts[@]}"; do
            # findmnt -r escapes spaces as \x20; paths here have none.
            umount "$m" 2>/dev/null || { [ "$tries" = 3 ] && umount -l "$m" 2>/dev/null; } || true
        done
    done
    local left
    left=$(for d in "$@"; do findmnt -rn -o TARGET | awk -v p="$d" 'index($0, p) == 1'; done)
    [ -z "$left" ] || { _fleet_err "mounts left: $(echo $left)"; return 1; }
}

# fleet_down NAME — remove the host: its containers, engine, every process in its
# namespace (denvd and whatever `exec` started), veth, namespace, mounts, data.
fleet_down() {
    local n=${1:?usage: fleet_down NAME}
    _fleet_check_name "$n" || return 1
    local dir ns veth root rc=0
    dir=$(_fleet_dir "$n")
    ns=$(fleet_ns "$n")
    veth=$(_fleet_veth "$n")
    root=$(_fleet_root "$n")
    # The link's delay processes (one runs in the root namespace) and rules.
    [ -f "$dir/link-slow" ] && fleet_link_clear "$n" >/dev/null 2>&1
    # Processes started in the namespace that are not the engine first (denvd would
    # otherwise see its environments die and act on it). denvd's DNS refusers
    # (`denvd __dns-refuser <bridge> <gateway>`) leave their pid file
    # /run/denv-dns/<bridge>.pid when killed: removed with them.
    local eng others p refusers=() a
    eng=" $(_fleet_cg_pids "$n" | tr '\n' ' ') "
    others=()
    for p in $(_fleet_ns_pids "$n"); do
        [[ "$eng" == *" $p "* ]] && continue
        others+=("$p")
        mapfile -d '' -t a <"/proc/$p/cmdline" 2>/dev/null || continue
        [ "${a[1]:-}" = __dns-refuser ] && [ -n "${a[2]:-}" ] && refusers+=("$p:${a[2]}")
    done
    [ "${#others[@]}" -eq 0 ] || _fleet_kill_pids "$n: processes in $ns" 5 "${others[@]}"
    for a in "${refusers[@]}"; do
        [ "$(cut -d' ' -f1 "/run/denv-dns/${a#*:}.pid" 2>/dev/null)" = "${a%%:*}" ] && rm -f "/run/denv-dns/${a#*:}.pid"
    done
    # Containers at once (no stop timeout), then the engine.
    if _fleet_engine_ready "$n"; then
        local ids
        ids=$(_fleet_docker "$n" ps -aq)
        # shellcheck disable=SC2086
        [ -z "$ids" ] || timeout 60 docker -H "unix://$(fleet_sock "$n")" rm -f $ids >/dev/null 2>&1 || true
    fi
    fleet_engine_stop "$n" || rc=1
    # Anything still in the namespace.
    # shellcheck disable=SC2046
    _fleet_kill_pids "$n: processes in $ns" 5 $(_fleet_ns_pids "$n")
    ip link del "$veth" 2>/dev/null || true
    # The egress canary's namespace of the host's denvd (named after the host's).
    [ -e "/run/netns/$ns" ] && ip netns del "denv-egress-canary-$(stat -Lc %i "/run/netns/$ns")" 2>/dev/null
    [ -e "/run/netns/$ns" ] && { ip netns del "$ns" || rc=1; }
    _fleet_umount_under "$dir/" "$root/" || rc=1
    if [ "$rc" = 0 ]; then
        rm -rf --one-file-system "$dir" "$root"
    fi
    local d
    _fleet_cg_all "$n" | while read -r d; do rmdir "$d" 2>/dev/null || _fleet_log "$n: cgroup $d not removed (busy)"; done
    ip link show "$veth" >/dev/null 2>&1 && { _fleet_err "$veth still there"; rc=1; }
    [ "$rc" = 0 ] && _fleet_log "$n: down"
    return $rc
}

# fleet_down_all — every host down, then the bridge and its rules.
fleet_down_all() {
    local n rc=0
    for n in $(fleet_hosts); do fleet_down "$n" || rc=1; done
    [ "$rc" = 0 ] || return 1
    fleet_net_down
}

# --- faults -----------------------------------------------------------------------

_fleet_exists() {
    [ -e "/run/netns/$(fleet_ns "$1")" ] && ip link show "$(_fleet_veth "$1")" >/dev/null 2>&1 ||
        _fleet_err "no fleet host ${1:-} (run: up NAME IDX)"
}

# fleet_link_cut NAME — unplug the host's cable: the root side of its veth goes down,
# so the host's eth0 loses carrier and frames either way are dropped without an answer.
# Established TCP connections hang (retransmitting) rather than reset, as with a real
# cable cut, and resume after link-restore if they did not time out meanwhile. (netem
# loss 100% would drop too, but only in the direction its qdisc is on, and the kernel
# tells local senders about qdisc drops; a downed link is what a pulled cable is.)
fleet_link_cut() {
    _fleet_exists "${1:-}" || return 1
    ip link set "$(_fleet_veth "$1")" down && _fleet_log "$1: link cut"
}
fleet_link_restore() {
    _fleet_exists "${1:-}" || return 1
    ip link set "$(_fleet_veth "$1")" up && _fleet_log "$1: link restored"
}

# fleet_link_slow NAME DELAY_MS RATE_MBIT — DELAY_MS of delay and a RATE_MBIT rate limit
# on each direction of the host's link, replacing any earlier setting; DELAY_MS may be 0.
# With sch_netem: `netem delay … rate …` on both ends of the veth (dfv-NAME in the root
# namespace: towards the host; eth0 in the host: from it). Without it (kernels built
# without CONFIG_NET_SCH_NETEM, such as this test machine's) the rate is tbf on both
# ends, and the delay is added where packets ENTER a namespace, by
# e2e/lib/fleet-delay.py holding them through NFQUEUE: in the host (mangle PREROUTING
# -i eth0, queue 7) and in the root namespace for what the host sends (mangle
# PREROUTING -m physdev --physdev-in dfv-NAME, queue 1000+IDX). Not on the way out: a
# packet held in its sender's own namespace still counts against the sending socket
# (TCP small queues), and a bulk transfer then crawls (100 MB took 100 s instead of 4 s).
fleet_link_slow() {
    local n=${1:-} delay=${2:-} rate=${3:-}
    [[ "$delay" =~ ^[0-9]+$ ]] && [[ "$rate" =~ ^[0-9]+$ ]] && [ "$rate" -gt 0 ] ||
        { _fleet_err "usage: link-slow NAME DELAY_MS RATE_MBIT"; return 1; }
    _fleet_exists "$n" || return 1
    fleet_link_clear "$n" >/dev/null 2>&1
    local veth nsx dir
    veth=$(_fleet_veth "$n")
    nsx=(nsenter --net="/run/netns/$(fleet_ns "$n")" --)
    dir=$(_fleet_dir "$n")
    echo "${delay}ms/${rate}mbit" >"$dir/link-slow"
    local q=(netem delay "${delay}ms" rate "${rate}mbit" limit 100000)
    if tc qdisc replace dev "$veth" root "${q[@]}" 2>/dev/null; then
        "${nsx[@]}" tc qdisc replace dev eth0 root "${q[@]}" ||
            { _fleet_err "$n: tc netem in the namespace failed"; return 1; }
        _fleet_log "$n: link slowed to $rate Mbit/s with $delay ms delay each way (netem)"
        return 0
    fi
    # tbf: a bucket of 10 ms at the rate (at least 64 KiB, a GSO packet), a queue of 250 ms.
    local bytes=$((rate * 125000))
    local burst=$((bytes / 100 > 65536 ? bytes / 100 : 65536))
    local limit=$((bytes / 4 > 262144 ? bytes / 4 : 262144))
    local t=(tbf rate "${rate}mbit" burst "$burst" limit "$limit")
    tc qdisc replace dev "$veth" root "${t[@]}" && "${nsx[@]}" tc qdisc replace dev eth0 root "${t[@]}" ||
        { _fleet_err "$n: tc tbf failed"; return 1; }
    if [ "$delay" -gt 0 ]; then
        local qroot=$((1000 + $(cat "$dir/idx")))
        _fleet_delay_start "$n" host 7 "$delay" "${nsx[@]}" || return 1
        _fleet_delay_start "$n" root "$qroot" "$delay" || return 1
        "${nsx[@]}" iptables -w -t mangle -I PREROUTING 1 -i eth0 -j NFQUEUE --queue-num 7 --queue-bypass &&
            iptables -w -t mangle -I PREROUTING 1 -m physdev --physdev-in "$veth" -j NFQUEUE --queue-num "$qroot" --queue-bypass ||
            { _fleet_err "$n: the NFQUEUE rules for the delay failed"; return 1; }
    fi
    _fleet_log "$n: link slowed to $rate Mbit/s with $delay ms delay each way (tbf$([ "$delay" -gt 0 ] && echo ", NFQUEUE delay"))"
}

# _fleet_delay_start NAME WHERE QUEUE DELAY_MS [NSENTER...] — start fleet-delay.py on
# QUEUE (in the namespace NSENTER enters, else the root one) and wait until it holds it
# (before that, the rules' --queue-bypass would let packets through undelayed).
_fleet_delay_start() {
    local n=$1 where=$2 queue=$3 delay=$4 dir pid i
    shift 4
    dir=$(_fleet_dir "$n")
    setsid nohup "$@" python3 "$FLEET_LIB_DIR/fleet-delay.py" "$queue" "$delay" >"$dir/delay-$where.log" 2>&1 </dev/null &
    pid=$!
    disown "$pid" 2>/dev/null || true
    echo "$pid" >"$dir/delay-$where.pid"
    for i in $(seq 1 50); do
        "$@" awk -v q="$queue" -v p="$pid" '$1 == q && $2 == p' /proc/net/netfilter/nfnetlink_queue 2>/dev/null | grep -q . && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    tail -5 "$dir/delay-$where.log" >&2
    _fleet_err "$n: fleet-delay.py ($where, queue $queue) did not start"
}

# fleet_link_clear NAME — remove what link-slow set.
fleet_link_clear() {
    local n=${1:-}
    _fleet_exists "$n" || return 1
    local nsx dir veth where
    nsx=(nsenter --net="/run/netns/$(fleet_ns "$n")" --)
    dir=$(_fleet_dir "$n")
    veth=$(_fleet_veth "$n")
    while "${nsx[@]}" iptables -w -t mangle -D PREROUTING -i eth0 -j NFQUEUE --queue-num 7 --queue-bypass 2>/dev/null; do :; done
    local r
    while r=$(iptables -w -t mangle -S PREROUTING 2>/dev/null | grep -m1 -- "--physdev-in $veth .*NFQUEUE"); do
        # shellcheck disable=SC2086
        iptables -w -t mangle ${r/-A /-D } || break
    done
    # What the delay processes still hold is let through within the delay.
    local held
    held=$(sed -n 's/^\([0-9]*\)ms.*/\1/p' "$dir/link-slow" 2>/dev/null)
    [ -n "$held" ] && [ "$held" -gt 0 ] && [ -f "$dir/delay-host.pid" ] && sleep "$(((held + 99) / 100 / 10)).$(((held + 99) / 100 % 10))"
    for where in host root; do
        if [ -f "$dir/delay-$where.pid" ]; then
            _fleet_kill_pids "$n: fleet-delay.py" 2 "$(cat "$dir/delay-$where.pid")"
            rm -f "$dir/delay-$where.pid"
        fi
    done
    tc qdisc del dev "$veth" root 2>/dev/null || true
    "${nsx[@]}" tc qdisc del dev eth0 root 2>/dev/null || true
    rm -f "$dir/link-slow"
    _fleet_log "$n: link cleared"
}

# fleet_exec NAME CMD... — run CMD in the host's network namespace with DOCKER_HOST
# set to its engine (a caller's DOCKER_HOST is replaced) and FLEET_HOST=NAME. CMD also
# gets a UTS namespace with the host name NAME (denvd reports it; the control plane
# shows it as the host's name). It shares the machine's mounts: zfs-fuse mounts its
# datasets in the machine's mount namespace, and a denvd that writes into them (a
# received snapshot) must see them (this machine's / is a private mount, so a mount
# namespace of its own would not). /run/netns is the machine's: denvd names its egress
# canary's namespace after its own network namespace, so hosts do not share one.
# Exit status 125: the namespace could not be set up.
fleet_exec() {
    local n=${1:-}
    shift || true
    [ $# -gt 0 ] || { _fleet_err "usage: exec NAME CMD..."; return 1; }
    _fleet_exists "$n" || return 1
    DOCKER_HOST="unix://$(fleet_sock "$n")" FLEET_HOST="$n" \
        nsenter --net="/run/netns/$(fleet_ns "$n")" -- \
        unshare --uts -- sh -c '
            hostname "$FLEET_HOST" || exit 125
            exec "$@"' sh "$@"
}

# fleet_status — one line per host: name, address, netns, link, engine pid, containers.
fleet_status() {
    local n idx addr link eng cont qd
    printf '%-12s %-13s %-6s %-18s %-8s %s\n' HOST ADDRESS NETNS LINK ENGINE CONTAINERS
    for n in $(fleet_hosts); do
        idx=$(cat "$(_fleet_dir "$n")/idx" 2>/dev/null || echo '?')
        addr=$([ "$idx" = '?' ] && echo '?' || echo "$FLEET_PREFIX.$((10 + idx))")
        if ip link show "$(_fleet_veth "$n")" >/dev/null 2>&1; then
            if ip -o link show dev "$(_fleet_veth "$n")" | grep -q '[<,]UP[,>]'; then link=up; else link=cut; fi
            qd=$(cat "$(_fleet_dir "$n")/link-slow" 2>/dev/null)
            [ -n "$qd" ] && link="$link,$qd"
        else
            link=none
        fi
        eng=$(_fleet_engine_pid "$n" || echo stopped)
        cont=$(_fleet_docker "$n" ps -q 2>/dev/null | wc -l)
        printf '%-12s %-13s %-6s %-18s %-8s %s\n' "$n" "$addr" \
            "$([ -e "/run/netns/$(fleet_ns "$n")" ] && echo yes || echo no)" "$link" "$eng" "$cont"
    done
    printf 'bridge %s: %s\n' "$FLEET_BRIDGE" "$(ip -br addr show "$FLEET_BRIDGE" 2>/dev/null | awk '{print $2, $3}' || echo absent)"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -uo pipefail
    cmd=${1:-}
    shift || true
    case "$cmd" in
        up) fleet_up "$@" ;;
        down) fleet_down "$@" ;;
        down-all) fleet_down_all ;;
        engine-stop) fleet_engine_stop "$@" ;;
        engine-start) fleet_engine_start "${1:-}" && echo "DOCKER_HOST=unix://$(fleet_sock "$1")" ;;
        link-cut) fleet_link_cut "$@" ;;
        link-restore) fleet_link_restore "$@" ;;
        link-slow) fleet_link_slow "$@" ;;
        link-clear) fleet_link_clear "$@" ;;
        exec) fleet_exec "$@" ;;
        images) fleet_images "$@" ;;
        status) fleet_status ;;
        sock) fleet_sock "${1:?usage: sock NAME}" ;;
        ip) fleet_ip "${1:?usage: ip NAME}" ;;
        -h|--help|help|"") sed -n '2,/^$/p' "$0" >&2; [ -n "$cmd" ] ;;
        *) _fleet_log "error: unknown verb $cmd"; sed -n '9,20p' "$0" >&2; exit 2 ;;
    esac
fi
