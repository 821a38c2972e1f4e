#!/usr/bin/env bash
# A ZFS pool on a file, with Debian's zfs-fuse (the kernel has no ZFS module).
# Run it or source it.
#
#   e2e/lib/zfs.sh create  POOL [SIZE] [FILE]   # default SIZE 2G, FILE /var/lib/POOL.zpool
#   e2e/lib/zfs.sh destroy POOL [FILE]          # destroy the pool, delete FILE
#   e2e/lib/zfs.sh status  POOL                 # exit 0 iff the pool is imported
#   e2e/lib/zfs.sh daemon                       # start zfs-fuse if it is not running
#
# `create` is idempotent: an imported pool is left alone, an exported one on
# FILE is imported again. The pool is mounted at /POOL. zfs-fuse is slow
# (FUSE) and has one rule to respect: unmount a clone before destroying it
# (`zfs destroy` of a mounted clone can hang). Needs root and zfs-fuse.
#
# Sourced, it defines zfs_daemon, zfs_pool_create, zfs_pool_destroy,
# zfs_pool_exists.

_zfs_log() { printf '[%s] zfs: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# zfs_daemon — start the zfs-fuse daemon when `zpool list` does not answer; wait until
# it does (up to 20 s). A pid file left by a daemon that is gone (a previous boot, a
# package's init script whose process was reaped) makes zfs-fuse refuse to start, so a
# pid file naming no live zfs-fuse is removed first.
zfs_daemon() {
    if ! command -v zfs-fuse >/dev/null 2>&1; then
        _zfs_log "error: zfs-fuse not installed (apt-get install zfs-fuse)"
        return 1
    fi
    zpool list >/dev/null 2>&1 && return 0
    if ! pgrep -x zfs-fuse >/dev/null; then
        local pidfile=/run/zfs-fuse.pid
        if [ -e "$pidfile" ]; then
            _zfs_log "removing stale $pidfile (pid $(cat "$pidfile" 2>/dev/null) is not zfs-fuse)"
            rm -f "$pidfile"
        fi
        # Likewise its kstat mount: a dead daemon's FUSE mount stays and the new daemon
        # cannot mount over it.
        if mountpoint -q /zfs-kstat 2>/dev/null; then
            _zfs_log "unmounting the stale /zfs-kstat of a dead zfs-fuse"
            umount -l /zfs-kstat || true
        fi
        if [ ! -e /dev/fuse ]; then
            _zfs_log "error: /dev/fuse is missing; zfs-fuse needs FUSE"
            return 1
        fi
        _zfs_log "starting zfs-fuse (log: /var/log/zfs-fuse.log)"
        if ! zfs-fuse --pidfile "$pidfile" >>/var/log/zfs-fuse.log 2>&1; then
            _zfs_log "error: zfs-fuse exited with $? (last lines of /var/log/zfs-fuse.log follow)"
            tail -n 5 /var/log/zfs-fuse.log >&2 || true
            return 1
        fi
    fi
    local _
    for _ in $(seq 1 40); do
        zpool list >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    _zfs_log "error: zfs-fuse is running but not answering after 20 s (see /var/log/zfs-fuse.log)"
    return 1
}

# zfs_pool_exists POOL
zfs_pool_exists() { zpool list -H -o name "$1" >/dev/null 2>&1; }

# zfs_pool_create POOL [SIZE] [FILE]
zfs_pool_create() {
    local pool=${1:?usage: zfs_pool_create POOL [SIZE] [FILE]}
    local size=${2:-2G} file=${3:-/var/lib/$1.zpool}
    zfs_daemon || return 1
    if zfs_pool_exists "$pool"; then
        _zfs_log "pool $pool already imported"
        return 0
    fi
    if [ -s "$file" ] && zpool import -d "$(dirname "$file")" "$pool" >/dev/null 2>&1; then
        _zfs_log "imported pool $pool from $file"
        return 0
    fi
    mkdir -p "$(dirname "$file")"
    truncate -s "$size" "$file"
    zpool create -f "$pool" "$file"
    _zfs_log "created pool $pool on $file ($size), mounted at $(zfs get -H -o value mountpoint "$pool")"
}

# zfs_pool_destroy POOL [FILE] — unmounts every dataset first (clones included).
zfs_pool_destroy() {
    local pool=${1:?usage: zfs_pool_destroy POOL [FILE]}
    local file=${2:-/var/lib/$1.zpool}
    if zfs_pool_exists "$pool"; then
        local ds
        # Deepest first, so clones and children unmount before their parents.
        for ds in $(zfs list -H -o name -r "$pool" | sort -r); do
            zfs umount "$ds" >/dev/null 2>&1 || true
        done
        zpool destroy -f "$pool"
        _zfs_log "destroyed pool $pool"
    fi
    rm -f "$file"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    cmd=${1:-}
    shift || true
    case "$cmd" in
        create) zfs_pool_create "$@" ;;
        destroy) zfs_pool_destroy "$@" ;;
        status) zfs_pool_exists "${1:?usage: zfs.sh status POOL}" ;;
        daemon) zfs_daemon ;;
        *) sed -n '2,14p' "$0" >&2; exit 2 ;;
    esac
fi
