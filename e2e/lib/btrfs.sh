#!/usr/bin/env bash
# Loop-mounted btrfs file systems for tests and demos (this machine has no
# spare block device). Run it or source it.
#
#   e2e/lib/btrfs.sh mount   MOUNTPOINT [SIZE] [IMAGE]   # default SIZE 4G
#   e2e/lib/btrfs.sh umount  MOUNTPOINT
#   e2e/lib/btrfs.sh destroy MOUNTPOINT [IMAGE]          # umount + delete image
#   e2e/lib/btrfs.sh status  MOUNTPOINT                  # exit 0 iff btrfs mounted
#
# IMAGE defaults to MOUNTPOINT with ".img" appended (e.g. /var/lib/denv-btrfs
# -> /var/lib/denv-btrfs.img). The image is a sparse file; SIZE is any
# `truncate -s` size (bytes, 512M, 4G). `mount` is idempotent: an already
# mounted btrfs at MOUNTPOINT is left alone, an existing image is reused (and
# grown to SIZE if it is smaller). Mounting uses a loop device that is freed
# again on unmount (autoclear). Needs root and btrfs-progs.
#
# Sourced, it defines btrfs_mount, btrfs_umount, btrfs_destroy, btrfs_is_mounted.

_btrfs_log() { printf '[%s] btrfs: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# btrfs_is_mounted MOUNTPOINT — true when a btrfs file system is mounted there.
btrfs_is_mounted() {
    [ "$(findmnt -n -o FSTYPE --mountpoint "$1" 2>/dev/null | tail -1)" = btrfs ]
}

# btrfs_mount MOUNTPOINT [SIZE] [IMAGE]
btrfs_mount() {
    local mnt=${1:?usage: btrfs_mount MOUNTPOINT [SIZE] [IMAGE]}
    mnt=${mnt%/}
    local size=${2:-4G} img=${3:-${mnt}.img}
    if btrfs_is_mounted "$mnt"; then
        _btrfs_log "$mnt already mounted"
        return 0
    fi
    if ! command -v mkfs.btrfs >/dev/null 2>&1; then
        _btrfs_log "error: mkfs.btrfs not found (apt-get install btrfs-progs)"
        return 1
    fi
    mkdir -p "$mnt" "$(dirname "$img")"
    if [ ! -s "$img" ]; then
        _btrfs_log "creating $img ($size, sparse)"
        truncate -s "$size" "$img"
        mkfs.btrfs -q -L denv "$img" >/dev/null
    elif [ "$(stat -c %s "$img")" -lt "$(numfmt --from=iec "${size%B}" 2>/dev/null || echo 0)" ]; then
        _btrfs_log "growing $img to $size"
        truncate -s "$size" "$img"
        local grow=1
    fi
    mount -o loop,noatime "$img" "$mnt"
    if [ "${grow:-0}" = 1 ]; then btrfs filesystem resize max "$mnt" >/dev/null; fi
    _btrfs_log "mounted $img at $mnt ($(findmnt -n -o SOURCE --mountpoint "$mnt"))"
}

# btrfs_umount MOUNTPOINT — unmount (no-op when nothing is mounted there).
btrfs_umount() {
    local mnt=${1:?usage: btrfs_umount MOUNTPOINT}
    mnt=${mnt%/}
    if ! btrfs_is_mounted "$mnt"; then
        _btrfs_log "$mnt not mounted"
        return 0
    fi
    local dev
    dev=$(findmnt -n -o SOURCE --mountpoint "$mnt" | tail -1)
    umount "$mnt"
    # autoclear frees the loop device; detach explicitly if it lingers.
    case "$dev" in /dev/loop*) losetup -d "$dev" 2>/dev/null || true ;; esac
    _btrfs_log "unmounted $mnt"
}

# btrfs_destroy MOUNTPOINT [IMAGE] — unmount and delete the image file.
btrfs_destroy() {
    local mnt=${1:?usage: btrfs_destroy MOUNTPOINT [IMAGE]}
    mnt=${mnt%/}
    local img=${2:-${mnt}.img}
    btrfs_umount "$mnt"
    rm -f "$img"
    rmdir "$mnt" 2>/dev/null || true
    _btrfs_log "removed $img"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    cmd=${1:-}
    shift || true
    case "$cmd" in
        mount) btrfs_mount "$@" ;;
        umount|unmount) btrfs_umount "$@" ;;
        destroy) btrfs_destroy "$@" ;;
        status) btrfs_is_mounted "${1:?usage: btrfs.sh status MOUNTPOINT}" ;;
        *) sed -n '2,16p' "$0" >&2; exit 2 ;;
    esac
fi
