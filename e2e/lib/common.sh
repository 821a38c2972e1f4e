# shellcheck shell=bash
# Shared helpers for the e2e shell scripts. Source it; do not run it.
#
#   . "$(dirname "$0")/../lib/common.sh"
#
# Functions: log, die, have, wait_apt, apt_install, docker_ready, start_dockerd,
# wait_dockerd.

# log MSG... — timestamped progress line on stderr.
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# die MSG... — log and exit 1.
die() { log "error: $*"; exit 1; }

# have CMD — true when CMD is on PATH.
have() { command -v "$1" >/dev/null 2>&1; }

# wait_apt — block until no other apt/dpkg process holds the dpkg lock
# (another engineer or the lead may be running apt-get in the background).
wait_apt() {
    local waited=0
    while pgrep -x apt-get >/dev/null 2>&1 || pgrep -x dpkg >/dev/null 2>&1 || pgrep -x apt >/dev/null 2>&1; do
        if [ "$waited" -eq 0 ]; then log "waiting for a running apt-get/dpkg to finish"; fi
        waited=$((waited + 1))
        sleep 2
    done
}

# apt_install PKG... — install the packages that are not installed yet,
# non-interactively. Runs `apt-get update` once if a package is unknown.
apt_install() {
    local missing=() p
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    wait_apt
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >>/var/log/denv-apt.log 2>&1; then
        apt-get update -q </dev/null >>/var/log/denv-apt.log 2>&1 || true
        apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null >>/var/log/denv-apt.log 2>&1 ||
            { tail -20 /var/log/denv-apt.log >&2; return 1; }
    fi
}

# docker_ready — true when the engine answers.
docker_ready() { docker info >/dev/null 2>&1; }

# start_dockerd — start dockerd in the background (no systemd on this
# machine) and wait until it answers. An engine already running is left alone.
#
# Docker 20.10 panics at start (`libnetwork.(*controller).reservePools`,
# "index out of range [0] with length 0", moby/moby#45057) when it was killed
# while creating a network: the network store holds a network without its
# address allocation. dockerd then never starts again by itself. When its log
# shows exactly that panic, the store (/var/lib/docker/network/files/local-kv.db)
# is moved aside under a timestamped name and dockerd is started once more;
# the engine forgets its user-defined networks, which denv re-creates with the
# next environment (a container still attached to a forgotten network does
# not start again until it is re-created).
start_dockerd() {
    docker_ready && return 0
    if pgrep -x dockerd >/dev/null 2>&1; then
        log "dockerd is running but not answering yet; waiting"
        wait_dockerd "" && return 0
        tail -30 /var/log/dockerd.log >&2
        die "dockerd did not become ready within 60s"
    fi
    local attempt
    for attempt in 1 2; do
        mkdir -p /var/log
        local offset
        offset=$(stat -c %s /var/log/dockerd.log 2>/dev/null || echo 0)
        log "starting dockerd (log: /var/log/dockerd.log)"
        # setsid: detach from this script's session so it survives the caller.
        setsid nohup dockerd --host unix:///var/run/docker.sock \
            >>/var/log/dockerd.log 2>&1 </dev/null &
        wait_dockerd "$!" && return 0
        local started
        started=$(tail -c +"$((offset + 1))" /var/log/dockerd.log 2>/dev/null)
        if [ "$attempt" = 1 ] && ! pgrep -x dockerd >/dev/null 2>&1 &&
            grep -q 'libnetwork.(\*controller).reservePools' <<<"$started"; then
            local store=/var/lib/docker/network/files/local-kv.db
            local aside
            aside="$store.corrupt-$(date +%Y%m%d%H%M%S)"
            log "dockerd panicked on a half-created network in its network store (moby/moby#45057); moving $store to $aside and starting it again"
            mv "$store" "$aside" || die "could not move $store aside"
            continue
        fi
        tail -30 /var/log/dockerd.log >&2
        die "dockerd did not become ready within 60s"
    done
}

# wait_dockerd PID — wait up to 60 s for the engine to answer; returns 1 at
# once when PID (the dockerd just started; empty for one already running)
# has exited.
wait_dockerd() {
    local pid=$1 i
    for i in $(seq 1 60); do
        docker_ready && { log "dockerd ready after ${i}s"; return 0; }
        if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && ! pgrep -x dockerd >/dev/null 2>&1; then
            log "dockerd exited before it answered"
            return 1
        fi
        sleep 1
    done
    return 1
}
