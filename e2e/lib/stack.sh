#!/usr/bin/env bash
# Start a throwaway denv stack on this machine: denv-cp on SQLite and one denvd joined
# with a freshly minted token. Source this file, then call `stack_up [--btrfs]`.
#
# Exports: DENV_SERVER, DENV_API_KEY, STACK_DIR (logs: $STACK_DIR/cp.log, $STACK_DIR/denvd.log),
#          PATH with target/debug first (DENV_BIN_DIR instead, e.g. a release build's
#          directory for the benchmark). `stack_down` stops both processes, destroys the
# environments the stack created (containers, networks) and removes $STACK_DIR.
# `stack_logs` prints both logs (for failures).

E2E_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO_ROOT="$(cd "$E2E_ROOT/.." && pwd)"

stack_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

stack_up() {
  local storage="dir"
  [ "${1:-}" = "--btrfs" ] && storage="btrfs"
  export PATH="${DENV_BIN_DIR:-$REPO_ROOT/target/debug}:$PATH"
  STACK_DIR="$(mktemp -d /tmp/denv-stack.XXXXXX)"
  export STACK_DIR
  local port; port="$(stack_free_port)"
  export DENV_SERVER="http://127.0.0.1:$port"
  export DENV_API_KEY="${STACK_KEY:-dak_e2e_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')}"
  (cd "$STACK_DIR" && DENV_BOOTSTRAP_KEY="$DENV_API_KEY" exec denv-cp -addr "127.0.0.1:$port" -db "$STACK_DIR/denv.db" \
      -public-url "$DENV_SERVER" >"$STACK_DIR/cp.log" 2>&1) &
  echo $! >"$STACK_DIR/cp.pid"
  for _ in $(seq 1 100); do
    curl -fsS "$DENV_SERVER/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fsS "$DENV_SERVER/health" >/dev/null || { echo "denv-cp did not start"; cat "$STACK_DIR/cp.log"; return 1; }

  local data="$STACK_DIR/data" extra=()
  if [ "$storage" = "btrfs" ]; then
    data="/var/lib/denv-btrfs/$(basename "$STACK_DIR")"
    bash "$E2E_ROOT/lib/btrfs.sh" mount /var/lib/denv-btrfs 8G >/dev/null
    mkdir -p "$data"
    echo "$data" >"$STACK_DIR/btrfs-data"
    extra+=(--btrfs)
  fi
  echo "$data" >"$STACK_DIR/data-path"
  local token
  token="$(denv host join-token | python3 -c 'import json,sys;print(json.load(sys.stdin)["token"])')" || return 1
  (exec denvd join --server "$DENV_SERVER" --token "$token" --state "$STACK_DIR/host.json" --data "$data" "${extra[@]}" \
      >"$STACK_DIR/denvd.log" 2>&1) &
  echo $! >"$STACK_DIR/denvd.pid"
  for _ in $(seq 1 100); do
    denv host list 2>/dev/null | grep -q '"connected": true' && return 0
    sleep 0.2
  done
  echo "denvd did not connect"; stack_logs; return 1
}

stack_logs() {
  [ -n "${STACK_DIR:-}" ] || return 0
  echo "----- denv-cp log ($STACK_DIR/cp.log) -----"; tail -n 200 "$STACK_DIR/cp.log" 2>/dev/null
  echo "----- denvd log ($STACK_DIR/denvd.log) -----"; tail -n 200 "$STACK_DIR/denvd.log" 2>/dev/null
}

stack_down() {
  [ -n "${STACK_DIR:-}" ] && [ -d "$STACK_DIR" ] || return 0
  for p in denvd cp; do
    if [ -f "$STACK_DIR/$p.pid" ]; then kill "$(cat "$STACK_DIR/$p.pid")" 2>/dev/null || true; fi
  done
  sleep 0.5
  for p in denvd cp; do
    if [ -f "$STACK_DIR/$p.pid" ]; then kill -9 "$(cat "$STACK_DIR/$p.pid")" 2>/dev/null || true; fi
  done
  # Remove whatever this stack's sidecar left running: every container and network
  # labelled as denv-managed whose env id this stack created.
  local ids data
  data="$(cat "$STACK_DIR/data-path" 2>/dev/null)"
  ids="$(ls "$data/envs" 2>/dev/null || true)"
  for id in $ids; do
    docker ps -aq --filter "label=denv.env=$id" | xargs -r docker rm -f >/dev/null 2>&1
    docker network ls -q --filter "label=denv.env=$id" | xargs -r docker network rm >/dev/null 2>&1
  done
  if [ -f "$STACK_DIR/btrfs-data" ]; then
    local d; d="$(cat "$STACK_DIR/btrfs-data")"
    btrfs subvolume list -o "$d" 2>/dev/null | awk '{print $NF}' >/dev/null
    find "$d" -mindepth 1 -maxdepth 6 -type d 2>/dev/null | sort -r | while read -r sv; do
      btrfs subvolume delete "$sv" >/dev/null 2>&1 || true
    done
    rm -rf "$d"
  fi
  rm -rf "$STACK_DIR"
  unset STACK_DIR
}
