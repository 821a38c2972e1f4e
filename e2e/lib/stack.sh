#!/usr/bin/env bash
# Start a throwaway denv stack on this machine: denv-cp on SQLite and one denvd joined
# with a freshly minted token. Source this file, then call `stack_up [--btrfs|--zfs]`.
#
#   stack_up            dir storage, data under $STACK_DIR/data
#   stack_up --btrfs    btrfs storage, data under /var/lib/denv-btrfs/<stack> (the loop
#                       file system of lib/btrfs.sh, mounted on first use)
#   stack_up --zfs      zfs storage on pool $E2E_ZFS_POOL (default denve2e, made on first
#                       use by lib/zfs.sh: a ${E2E_ZFS_SIZE:-4G} file /var/lib/<pool>.zpool),
#                       datasets <pool>/envs/<env>, mounted under $STACK_DIR/data
#
# stack_up fails unless the sidecar connects AND reports the storage asked for (a zfs
# run that fell back to dir would be a lie).
#
# Exports: DENV_SERVER, DENV_API_KEY, STACK_DIR (logs: $STACK_DIR/cp.log, $STACK_DIR/denvd.log),
#          STACK_STORAGE, PATH with target/debug first (DENV_BIN_DIR instead, e.g. a
#          release build's directory for the benchmark).
# stack_env_ids   every environment id this stack created (the control plane's database,
#                 plus the ids the sidecar has under its data directory)
# stack_leftovers prints one line per thing of this stack's environments still on the
#                 machine (containers, networks, data directory entries, btrfs subvolumes,
#                 zfs datasets); returns 1 when there is any
# stack_clean     removes all of those
# stack_down      stops both processes, stack_clean, removes $STACK_DIR
# stack_logs      prints the tail of both logs (for failures)

E2E_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_ROOT="$(cd "$E2E_ROOT/.." && pwd)"
# shellcheck source=zfs.sh
source "$E2E_ROOT/lib/zfs.sh"

stack_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

stack_up() {
  local storage="dir"
  case "${1:-}" in
    --btrfs) storage="btrfs" ;;
    --zfs) storage="zfs" ;;
    "") ;;
    *) echo "stack_up: unknown option $1 (--btrfs, --zfs)"; return 2 ;;
  esac
  export PATH="${DENV_BIN_DIR:-$REPO_ROOT/target/debug}:$PATH"
  STACK_DIR="$(mktemp -d /tmp/denv-stack.XXXXXX)"
  export STACK_DIR STACK_STORAGE="$storage"
  echo "$storage" >"$STACK_DIR/storage"
  local data="$STACK_DIR/data" extra=()
  case "$storage" in
    btrfs)
      data="/var/lib/denv-btrfs/$(basename "$STACK_DIR")"
      local msg
      msg="$(bash "$E2E_ROOT/lib/btrfs.sh" mount /var/lib/denv-btrfs 8G 2>&1)" || {
        echo "could not mount the btrfs file system at /var/lib/denv-btrfs: $msg"; return 1; }
      mkdir -p "$data"
      echo "$data" >"$STACK_DIR/btrfs-data"
      extra+=(--btrfs)
      ;;
    zfs)
      local pool="${E2E_ZFS_POOL:-denve2e}"
      local msg
      msg="$(zfs_pool_create "$pool" "${E2E_ZFS_SIZE:-4G}" 2>&1)" || {
        echo "could not create or import the zfs pool $pool: $msg"; return 1; }
      echo "$pool" >"$STACK_DIR/zfs-pool"
      extra+=(--zfs-pool "$pool")
      ;;
  esac
  echo "$data" >"$STACK_DIR/data-path"

  local port; port="$(stack_free_port)"
  export DENV_SERVER="http://127.0.0.1:$port"
  export DENV_API_KEY="${STACK_KEY:-dak_e2e_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
  (cd "$STACK_DIR" && DENV_BOOTSTRAP_KEY="$DENV_API_KEY" exec denv-cp -addr "127.0.0.1:$port" -db "$STACK_DIR/denv.db" \
      -public-url "$DENV_SERVER" >"$STACK_DIR/cp.log" 2>&1) &
  echo $! >"$STACK_DIR/cp.pid"
  disown $!   # no "Killed" job notices when stack_down (or a case) kills it
  for _ in $(seq 1 150); do
    curl -fsS "$DENV_SERVER/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "$DENV_SERVER/health" >/dev/null || { echo "denv-cp did not start"; cat "$STACK_DIR/cp.log"; return 1; }

  local token
  token="$(denv host join-token | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])')" || return 1
  # A data port on a free loopback port: other hosts a case starts fetch its snapshots
  # and images there.
  (exec denvd join --server "$DENV_SERVER" --token "$token" --state "$STACK_DIR/host.json" --data "$data" "${extra[@]}" \
      --data-addr "127.0.0.1:$(stack_free_port)" >"$STACK_DIR/denvd.log" 2>&1) &
  echo $! >"$STACK_DIR/denvd.pid"
  disown $!
  local hosts=""
  for _ in $(seq 1 150); do
    hosts="$(denv host list 2>/dev/null)"
    [[ "$hosts" == *'"connected": true'* ]] && break
    sleep 0.2
  done
  [[ "$hosts" == *'"connected": true'* ]] || { echo "denvd did not connect"; stack_logs; return 1; }
  local reported
  reported="$(printf '%s' "$hosts" | python3 -c 'import json,sys; print(json.load(sys.stdin)["hosts"][0]["Capabilities"].get("storage",""))')"
  [ "$reported" = "$storage" ] || { echo "denvd reports storage '$reported', not '$storage'"; stack_logs; return 1; }
}

stack_logs() {
  [ -n "${STACK_DIR:-}" ] || return 0
  echo "----- denv-cp log ($STACK_DIR/cp.log, last ${1:-200} lines) -----"; tail -n "${1:-200}" "$STACK_DIR/cp.log" 2>/dev/null
  echo "----- denvd log ($STACK_DIR/denvd.log, last ${1:-200} lines) -----"; tail -n "${1:-200}" "$STACK_DIR/denvd.log" 2>/dev/null
}

# Every environment id of this stack: the control plane's environments table, plus what
# the sidecar has under its data directory (graders' forks, half-made environments).
stack_env_ids() {
  [ -n "${STACK_DIR:-}" ] || return 0
  local data; data="$(cat "$STACK_DIR/data-path" 2>/dev/null)"
  {
    [ -f "$STACK_DIR/denv.db" ] && python3 - "$STACK_DIR/denv.db" <<'EOF'
import sqlite3, sys
try:
    con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=10)
    for (i,) in con.execute("select id from environments"):
        print(i)
except Exception as e:
    print(f"stack_env_ids: {e}", file=sys.stderr)
EOF
    [ -n "$data" ] && ls -A "$data/envs" "$data/snaps" 2>/dev/null | grep -v -e '^$' -e ':$'
    true # no environments is an empty list, not a failure (callers may run under set -e)
  } | sort -u
}

# stack_leftovers [IDS...]: one line per leftover of this stack's environments.
stack_leftovers() {
  [ -n "${STACK_DIR:-}" ] || return 0
  local ids; ids="${*:-$(stack_env_ids)}"
  local data; data="$(cat "$STACK_DIR/data-path" 2>/dev/null)"
  local out="" id x
  for id in $ids; do
    for x in $(docker ps -a --filter "label=denv.env=$id" --format '{{.Names}}'); do out+="container $x (env $id)"$'\n'; done
    for x in $(docker network ls --filter "label=denv.env=$id" --format '{{.Name}}'); do out+="network $x (env $id)"$'\n'; done
  done
  if [ -n "$data" ]; then
    for x in "$data"/envs/* "$data"/snaps/*; do
      [ -e "$x" ] && out+="data directory entry $x"$'\n'
    done
  fi
  if [ -f "$STACK_DIR/btrfs-data" ]; then
    local d; d="$(cat "$STACK_DIR/btrfs-data")"
    for x in $(btrfs subvolume list -o /var/lib/denv-btrfs 2>/dev/null | awk '{print $NF}' | grep "^$(basename "$d")/"); do
      out+="btrfs subvolume /var/lib/denv-btrfs/$x"$'\n'
    done
  fi
  if [ -f "$STACK_DIR/zfs-pool" ]; then
    local pool; pool="$(cat "$STACK_DIR/zfs-pool")"
    for id in $ids; do
      for x in $(zfs list -H -t all -o name -r "$pool/envs/$id" 2>/dev/null); do out+="zfs dataset $x"$'\n'; done
    done
  fi
  printf '%s' "$out"
  [ -z "$out" ]
}

# Removes every container, network, subvolume and dataset of this stack's environments.
# stack_drop_rules OWNER: removes the nftables table and iptables chains of one denvd
# owner tag (what a killed denvd could not remove itself).
stack_drop_rules() {
  local o="$1" b c
  case "$o" in *[!0-9a-f]*|"") return 0 ;; esac
  nft delete table inet "denv_$o" >/dev/null 2>&1 || true
  for b in iptables ip6tables; do
    command -v "$b" >/dev/null || continue
    for c in FORWARD DOCKER-USER; do while $b -w -D "$c" -j "D$o-FWD" >/dev/null 2>&1; do :; done; done
    while $b -w -D INPUT -j "D$o-IN" >/dev/null 2>&1; do :; done
    for c in $($b -w -S 2>/dev/null | awk -v p="D$o-" '$1=="-N" && index($2,p)==1 {print $2}'); do $b -w -F "$c"; done
    for c in $($b -w -S 2>/dev/null | awk -v p="D$o-" '$1=="-N" && index($2,p)==1 {print $2}'); do $b -w -X "$c"; done
  done
}

stack_clean() {
  [ -n "${STACK_DIR:-}" ] && [ -d "$STACK_DIR" ] || return 0
  local ids id data
  ids="$(stack_env_ids)"
  data="$(cat "$STACK_DIR/data-path" 2>/dev/null)"
  local owners=""
  for id in $ids; do
    docker ps -aq --filter "label=denv.env=$id" | xargs -r docker rm -f >/dev/null 2>&1
    owners+=" $(docker network ls -q --filter "label=denv.env=$id" | xargs -r docker network inspect -f '{{index .Labels "denv.owner"}}' 2>/dev/null)"
    docker network ls -q --filter "label=denv.env=$id" | xargs -r docker network rm >/dev/null 2>&1
  done
  # The network rules of this stack's denvd (its owner tag), whatever it left.
  local o; for o in $(printf '%s\n' $owners | sort -u); do stack_drop_rules "$o"; done
  if [ -f "$STACK_DIR/zfs-pool" ]; then
    local pool ds; pool="$(cat "$STACK_DIR/zfs-pool")"
    # zfs-fuse: unmount every dataset (clones included) before destroying anything.
    # -R: forks of one environment are clones of another of this stack's environments.
    # A file system stays busy for a moment after the last container using it is
    # removed: try again for up to 15 s.
    local try err
    for try in $(seq 1 30); do
      for ds in $(for id in $ids; do zfs list -H -o name -r "$pool/envs/$id" 2>/dev/null; done | sort -r); do
        timeout 60 zfs unmount "$ds" >/dev/null 2>&1 || true
      done
      err=""
      for id in $ids; do
        if zfs list -H -o name "$pool/envs/$id" >/dev/null 2>&1; then
          err+="$(timeout 120 zfs destroy -R "$pool/envs/$id" 2>&1 >/dev/null)" || err+=" ($pool/envs/$id)"$'\n'
        fi
      done
      [ -z "$err" ] && break
      sleep 0.5
    done
    [ -z "$err" ] || printf 'stack_clean: zfs destroy -R failed: %s\n' "$err" >&2
  fi
  if [ -f "$STACK_DIR/btrfs-data" ]; then
    local d sv; d="$(cat "$STACK_DIR/btrfs-data")"
    find "$d" -mindepth 1 -maxdepth 6 -type d 2>/dev/null | sort -r | while read -r sv; do
      # (a plain directory is not an error: under `set -e` a false test ending the loop
      # would end the caller)
      if [ "$(stat -c %i "$sv" 2>/dev/null)" = 256 ]; then
        btrfs subvolume delete "$sv" >/dev/null 2>&1 || true
      fi
    done
    rm -rf "$d"
  elif [ -n "$data" ] && [ -d "$data" ]; then
    rm -rf "$data"
  fi
}

stack_down() {
  [ -n "${STACK_DIR:-}" ] && [ -d "$STACK_DIR" ] || return 0
  local p
  for p in denvd cp; do
    if [ -f "$STACK_DIR/$p.pid" ]; then kill "$(cat "$STACK_DIR/$p.pid")" 2>/dev/null || true; fi
  done
  for _ in $(seq 1 20); do
    kill -0 "$(cat "$STACK_DIR/denvd.pid" 2>/dev/null)" 2>/dev/null || kill -0 "$(cat "$STACK_DIR/cp.pid" 2>/dev/null)" 2>/dev/null || break
    sleep 0.1
  done
  for p in denvd cp; do
    if [ -f "$STACK_DIR/$p.pid" ]; then kill -9 "$(cat "$STACK_DIR/$p.pid")" 2>/dev/null || true; fi
  done
  local ids rc=0; ids="$(stack_env_ids)"
  stack_clean
  local left; left="$(stack_leftovers $ids)" || { printf 'stack_down: could not remove: %s\n' "$left" >&2; rc=1; }
  rm -rf "$STACK_DIR"
  unset STACK_DIR
  return $rc
}
