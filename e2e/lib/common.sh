# shellcheck shell=bash
# Shared helpers for the e2e shell scripts. Source it; do not run it.
#
#   . "$(dirname "$0")/../lib/common.sh"
#
# Functions: log, die, have, wait_apt, apt_install, docker_ready, start_dockerd.

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
# machine) when `docker info` fails, logging to /var/log/dockerd.log, and
# wait up to 60 s for it to answer. Never stops a running engine.
start_dockerd() {
    docker_ready && return 0
    if pgrep -x dockerd >/dev/null 2>&1; then
        log "dockerd is running but not answering yet; waiting"
    else
        log "starting dockerd (log: /var/log/dockerd.log)"
        mkdir -p /var/log
        # setsid: detach from this script's session so it survives the caller.
        setsid nohup dockerd --host unix:///var/run/docker.sock \
            >>/var/log/dockerd.log 2>&1 </dev/null &
    fi
    local i
    for i in $(seq 1 60); do
        docker_ready && { log "dockerd ready after ${i}s"; return 0; }
        sleep 1
    done
    tail -30 /var/log/dockerd.log >&2
    die "dockerd did not become ready within 60s"
}
