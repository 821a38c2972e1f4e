#!/usr/bin/env bash
# Build the local stand-in images the documented examples and the e2e tests use
# (busybox:1.36, denv-base:bookworm, postgres:16-alpine, python:3.12-slim,
# redis:7-alpine, ubuntu:24.04) from Debian packages only, and load them into
# the local Docker engine. No container registry is needed.
#
#   e2e/images/build.sh [--force] [--no-cache] [IMAGE...]
#
#   --force     rebuild images whose tag already exists (from the caches)
#   --no-cache  also redo the caches: debootstrap, busybox compile, docker
#               build layer cache (implies --force)
#   IMAGE     build only these (busybox base postgres python redis ubuntu);
#             default: all, busybox first.
#
# Caches: /var/cache/denv-images/ (or $DENV_IMAGE_CACHE): the debootstrap
# rootfs tarball, the static busybox binary, build logs.
# See e2e/images/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib/common.sh"

CACHE=${DENV_IMAGE_CACHE:-/var/cache/denv-images}
SUITE=bookworm
FORCE=0
NOCACHE=0
WANT=()
for a in "$@"; do
    case "$a" in
        --force) FORCE=1 ;;
        --no-cache) FORCE=1; NOCACHE=1 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        busybox|base|postgres|python|redis|ubuntu) WANT+=("$a") ;;
        *) die "unknown argument: $a" ;;
    esac
done
[ "${#WANT[@]}" -eq 0 ] && WANT=(busybox base postgres python redis ubuntu)

mkdir -p "$CACHE"
start_dockerd

# Rows of the summary table: "image|id|size|status|seconds".
ROWS=()

tag_of() {
    case "$1" in
        busybox) echo busybox:1.36 ;;
        base) echo denv-base:$SUITE ;;
        postgres) echo postgres:16-alpine ;;
        python) echo python:3.12-slim ;;
        redis) echo redis:7-alpine ;;
        ubuntu) echo ubuntu:24.04 ;;
    esac
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# record TAG STATUS SECONDS
record() {
    local id size
    id=$(docker image inspect -f '{{.Id}}' "$1" 2>/dev/null | cut -c8-19)
    size=$(docker image inspect -f '{{.Size}}' "$1" 2>/dev/null)
    size=$(awk -v s="${size:-0}" 'BEGIN{printf "%.1fMB", s/1e6}')
    ROWS+=("$1|${id:-?}|$size|$2|$3")
}

# --- busybox:1.36 ---------------------------------------------------------
# A static busybox built from Debian's busybox source with upstream's
# defconfig (what the official busybox image ships: `wget -T`, `nc`, no
# "standalone shell"), cached in $CACHE. Debian's own busybox-static binary is
# only the fallback: it is built without FEATURE_WGET_TIMEOUT, and
# `wget -T 4 ...` segfaults with it.

# busybox_binary — print the path of a static busybox, building it if needed.
busybox_binary() {
    local bin
    bin=$(ls "$CACHE"/busybox-*-static 2>/dev/null | head -1 || true)
    if [ "$NOCACHE" = 0 ] && [ -n "$bin" ] && [ -x "$bin" ]; then echo "$bin"; return; fi
    if build_busybox_from_source >&2; then
        ls "$CACHE"/busybox-*-static | head -1
        return
    fi
    log "warning: building busybox from source failed (log: $CACHE/busybox-build.log);"
    log "warning: falling back to Debian's busybox-static, whose wget has no -T"
    apt_install busybox-static >&2
    echo /bin/busybox
}

build_busybox_from_source() {
    apt_install gcc make libc6-dev bzip2 dpkg-dev xz-utils
    local work lists mirror ver
    work=$(mktemp -d /tmp/denv-busybox-src.XXXXXX)
    lists="$work/lists"
    mkdir -p "$lists/partial"
    mirror=$(mirror_url main) || return 1
    echo "deb-src $mirror $SUITE main" >"$work/src.list"
    local sec; sec=$(mirror_url security)
    [ -z "$sec" ] || echo "deb-src $sec $SUITE-security main" >>"$work/src.list"
    local opts=(-o "Dir::Etc::SourceList=$work/src.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$lists" -o Debug::NoLocking=1)
    log "fetching busybox source from $mirror (apt-get source)"
    (
        cd "$work" &&
            apt-get -q "${opts[@]}" update &&
            apt-get -q "${opts[@]}" source --download-only busybox &&
            dpkg-source -x busybox_*.dsc src &&
            cd src &&
            make defconfig &&
            sed -i -e 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/' \
                -e 's/^CONFIG_TC=y/# CONFIG_TC is not set/' .config &&
            log "compiling busybox (about 2-3 minutes on 2 cores)" &&
            make -j"$(nproc)" </dev/null
    ) >"$CACHE/busybox-build.log" 2>&1 || { rm -rf "$work"; return 1; }
    ver=$("$work/src/busybox" | head -1 | awk '{print $2}')
    local usage
    usage=$("$work/src/busybox" wget --help 2>&1 || true)
    if ! grep -q -- '-T SEC' <<<"$usage"; then
        rm -rf "$work"
        return 1
    fi
    rm -f "$CACHE"/busybox-*-static
    install -m 0755 "$work/src/busybox" "$CACHE/busybox-${ver#v}-static"
    rm -rf "$work"
}

build_busybox() {
    local tag=busybox:1.36 root bin
    bin=$(busybox_binary)
    root=$(mktemp -d /tmp/denv-busybox.XXXXXX)
    mkdir -p "$root"/{bin,etc,tmp,root,home,var/spool/mail,usr/bin,usr/sbin,sbin,proc,sys,dev}
    chmod 1777 "$root/tmp"
    chmod 700 "$root/root"
    cp "$bin" "$root/bin/busybox"
    local app
    for app in $("$root/bin/busybox" --list); do
        [ "$app" = busybox ] || ln -sf busybox "$root/bin/$app"
    done
    cat >"$root/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
daemon:x:1:1:daemon:/usr/sbin:/bin/false
nobody:x:65534:65534:nobody:/home:/bin/false
P
    cat >"$root/etc/group" <<'G'
root:x:0:
daemon:x:1:
nogroup:x:65534:
nobody:x:65534:
G
    echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
    tar -C "$root" --numeric-owner -c . |
        docker import --change 'CMD ["sh"]' \
            --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
            --message "denv local stand-in: busybox $("$root/bin/busybox" | head -1 | awk '{print $2}')" \
            - "$tag" >/dev/null
    rm -rf "$root"
}

# --- denv-base:bookworm ---------------------------------------------------
# debootstrap --variant=minbase from the host's configured Debian mirror.

# mirror_url [security] — the Debian (or Debian security) archive URL this
# machine's apt is configured with (one-line or deb822 sources). No host name is
# built in: with no Debian source configured, `main` fails with a message saying
# so, and `security` prints nothing (the images are then built without it).
mirror_url() {
    local want=${1:-main} f u first=""
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        # one-line format: deb [opts] URL suite ...; deb822: URIs: URL
        for u in $(sed -nE -e 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*/\2/p' \
                          -e 's/^[[:space:]]*URIs:[[:space:]]*//p' "$f"); do
            case "$want:$u" in
                security:*debian-security*) echo "${u%/}"; return ;;
                main:*debian-security*) ;;
                main:*/debian|main:*/debian/) echo "${u%/}"; return ;;
                main:http*) [ -n "$first" ] || first="${u%/}" ;;
            esac
        done
    done
    [ "$want" = security ] && return 0
    [ -n "$first" ] && { echo "$first"; return 0; }
    die "no Debian archive is configured in /etc/apt/sources.list or /etc/apt/sources.list.d/: the stand-in images are built from the machine's own apt sources"
}

# make_rootfs — debootstrap the base rootfs into $ROOTFS_TAR (cached).
make_rootfs() {
    apt_install debootstrap
    local mirror security root
    mirror=$(mirror_url main) || return 1
    security=$(mirror_url security)
    root=$(mktemp -d /tmp/denv-rootfs.XXXXXX)
    log "debootstrap --variant=minbase $SUITE from $mirror (log: $CACHE/debootstrap.log)"
    debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
        { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$root"; return 1; }
    cat >"$root/etc/apt/sources.list" <<S
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
S
    [ -z "$security" ] || echo "deb $security $SUITE-security main" >>"$root/etc/apt/sources.list"
    # Carry the host's apt proxy settings (if any) so builds reach the mirror.
    apt-config dump 2>/dev/null | grep -iE '^Acquire::[a-z]+::Proxy' >"$root/etc/apt/apt.conf.d/99denv-proxy" || true
    [ -s "$root/etc/apt/apt.conf.d/99denv-proxy" ] || rm -f "$root/etc/apt/apt.conf.d/99denv-proxy"
    # Container conventions of the official Debian images: no services
    # started by package scripts, no caches, no docs.
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'C'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
C
    cat >"$root/etc/dpkg/dpkg.cfg.d/docker-no-docs" <<'D'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
D
    echo 'APT::Install-Recommends "false";' >"$root/etc/apt/apt.conf.d/99denv-no-recommends"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
    : >"$root/etc/hostname"
    rm -f "$root/etc/resolv.conf" "$root/etc/hosts"
    tar -C "$root" --numeric-owner -cf "$ROOTFS_TAR.tmp" .
    mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
    rm -rf "$root"
}

build_base() {
    local tag=denv-base:$SUITE
    if [ -n "$ROOTFS_PID" ]; then
        # Started in the background while busybox compiled.
        wait "$ROOTFS_PID" || die "debootstrap failed"
        ROOTFS_PID=
    elif [ "$NOCACHE" = 1 ] || [ ! -s "$ROOTFS_TAR" ]; then
        make_rootfs || die "debootstrap failed"
    else
        log "using cached rootfs $ROOTFS_TAR"
    fi
    docker import --change 'CMD ["bash"]' \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --message "denv local base: debootstrap minbase $SUITE" "$ROOTFS_TAR" "$tag" >/dev/null
}

# --- images built with a Dockerfile FROM denv-base:bookworm ---------------
build_dockerfile() {
    local name=$1 tag=$2
    image_exists "denv-base:$SUITE" || build_one base
    log "docker build $tag (log: $CACHE/build-$name.log)"
    local nc=()
    [ "$NOCACHE" = 1 ] && nc=(--no-cache)
    docker build "${nc[@]}" --network host --build-arg "BASE=denv-base:$SUITE" -t "$tag" "$HERE/$name" \
        >"$CACHE/build-$name.log" 2>&1 ||
        { tail -30 "$CACHE/build-$name.log" >&2; die "docker build $tag failed"; }
}

build_one() {
    local name=$1 tag t0
    tag=$(tag_of "$name")
    t0=$(date +%s)
    if [ "$FORCE" = 0 ] && image_exists "$tag"; then
        record "$tag" cached 0
        return
    fi
    log "building $tag"
    case "$name" in
        busybox) build_busybox ;;
        base) build_base ;;
        *) build_dockerfile "$name" "$tag" ;;
    esac
    record "$tag" built $(( $(date +%s) - t0 ))
}

# debootstrap is network- and disk-bound, the busybox compile CPU-bound: when
# both are due, run debootstrap in the background meanwhile.
ROOTFS_TAR="$CACHE/rootfs-$SUITE-minbase.tar"
ROOTFS_PID=
needs() { [ "$FORCE" = 1 ] || ! image_exists "$(tag_of "$1")"; }
want() { local w; for w in "${WANT[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
base_due=0
if want base && needs base; then base_due=1; fi
for n in postgres python redis ubuntu; do
    if want "$n" && needs "$n" && ! image_exists "denv-base:$SUITE"; then base_due=1; fi
done
if [ "$base_due" = 1 ] && { [ "$NOCACHE" = 1 ] || [ ! -s "$ROOTFS_TAR" ]; } && want busybox && needs busybox; then
    apt_install debootstrap
    make_rootfs &
    ROOTFS_PID=$!
fi

for n in "${WANT[@]}"; do
    build_one "$n"
    if [ "$n" = busybox ] && docker run --rm busybox:1.36 true 2>/dev/null; then
        date -u +%FT%TZ >/tmp/denv-docker-ready
    fi
done

printf '%-22s %-14s %-10s %-8s %s\n' IMAGE ID SIZE STATUS SECONDS
for r in "${ROWS[@]}"; do
    IFS='|' read -r a b c d e <<<"$r"
    printf '%-22s %-14s %-10s %-8s %s\n' "$a" "$b" "$c" "$d" "$e"
done
