#!/usr/bin/env bash
# Many hosts (issue #16's done-when): two denv-cp replicas on one PostgreSQL, serving
# TLS, behind a TCP load balancer (lb.py); three denvd on this machine with their own
# data directories (dir, btrfs, zfs), each dialing the balancer, so their streams land
# on either replica. Then, all over https:
#   1. the quickstart with the CLI (deploy, exec, snapshot, fork, verify reward 1) and
#      with the Python client (sandbox from the version, exec, verify);
#   2. 24 forks of one version at once through the Python client: they spread over the
#      three hosts (each gets some), each answers exec with the version's data, and the
#      forks on hosts without the snapshot record where it was shipped from;
#   3. replica A is killed (SIGKILL) while a deploy it runs is under way: replica B
#      takes the lease over and the deployment ends with a recorded outcome;
#   4. a host's denvd is killed (SIGKILL) while a fork runs on it, then started again:
#      the fork ends with a recorded outcome;
#   5. everything is destroyed, and nothing of any environment is left: no container,
#      network or data directory entry (snapshot copies included); no deployment still
#      running; no ERROR line in any log.
# Prints `PASS fleet (Ns)` or `FAIL fleet (Ns)` with the reason and the logs, and the
# closing line `fleet: N passed, N failed`.
set -uo pipefail
E2E="$(cd "$(dirname "$0")/.." && pwd)"
REPO_ROOT="$(cd "$E2E/.." && pwd)"
export PATH="${DENV_BIN_DIR:-$REPO_ROOT/target/debug}:$PATH"
# shellcheck source=../lib/assert.sh
source "$E2E/lib/assert.sh"
# shellcheck source=../lib/tls.sh
source "$E2E/lib/tls.sh"
# shellcheck source=../lib/python.sh
source "$E2E/lib/python.sh"
# shellcheck source=../lib/zfs.sh
source "$E2E/lib/zfs.sh"

FLEET="$(mktemp -d /tmp/denv-fleet.XXXXXX)"
chmod 755 "$FLEET"   # PostgreSQL's cluster lives under it and runs as the postgres user
T0=$(date +%s)
PGDIR="$FLEET/pg"
BTRFS_DATA="/var/lib/denv-btrfs/$(basename "$FLEET")"
ZPOOL="${E2E_ZFS_POOL:-denve2e}"
HOST_DATA=("$FLEET/h1" "$BTRFS_DATA" "$FLEET/h3")
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_for() { # wait_for <seconds> <what> <command...>
  local secs="$1" what="$2"; shift 2
  for _ in $(seq 1 $((secs * 5))); do "$@" && return 0; sleep 0.2; done
  die "$what (after ${secs}s)"
}
psql_q() { PGPASSWORD=denv psql -h 127.0.0.1 -p "$(cat "$PGDIR/port")" -U denv -d denv -tAc "$1"; }

# --- teardown: whatever happened, stop every process and remove what the hosts made.
teardown() {
  local p
  for p in "$FLEET"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null; done
  sleep 1
  for p in "$FLEET"/*.pid; do [ -f "$p" ] && kill -9 "$(cat "$p")" 2>/dev/null; done
  local ids id
  ids="$( (psql_q "select id from environments" 2>/dev/null; for d in "${HOST_DATA[@]}"; do ls -A "$d/envs" "$d/snaps" 2>/dev/null; done) | grep '^env_' | sort -u)"
  for id in $ids; do
    docker ps -aq --filter "label=denv.env=$id" | xargs -r docker rm -f >/dev/null 2>&1
    docker network ls -q --filter "label=denv.env=$id" | xargs -r docker network rm >/dev/null 2>&1
  done
  local ds
  for id in $ids; do
    for ds in $(zfs list -H -o name -r "$ZPOOL/envs/$id" 2>/dev/null | sort -r); do timeout 60 zfs unmount "$ds" >/dev/null 2>&1; done
  done
  for id in $ids; do zfs destroy -R "$ZPOOL/envs/$id" >/dev/null 2>&1; done
  if [ -n "${BTRFS_DATA:-}" ] && [ -d "$BTRFS_DATA" ]; then
    find "$BTRFS_DATA" -mindepth 1 -maxdepth 6 -type d 2>/dev/null | sort -r | while read -r sv; do
      if [ "$(stat -c %i "$sv" 2>/dev/null)" = 256 ]; then btrfs subvolume delete "$sv" >/dev/null 2>&1 || true; fi
    done
    rm -rf "$BTRFS_DATA"
  fi
  [ -n "${PGDIR:-}" ] && bash "$E2E/lib/postgres.sh" stop "$PGDIR" >/dev/null 2>&1
  rm -rf "$FLEET"
}

logs() {
  local f
  for f in "$FLEET"/*.log; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f") (last 60 lines) -----"; tail -n 60 "$f"
  done
}

# ERROR lines the scenario provokes on purpose (an extended regex): none so far.
ALLOWED_ERRORS='^$'

scenario() {
  set -eE
  trap 'echo "fleet: failed at line $LINENO: $BASH_COMMAND"' ERR
  cd "$FLEET"
  # --- PostgreSQL, a CA, the replicas and the balancer.
  DSN="$(bash "$E2E/lib/postgres.sh" start "$PGDIR" 2>>"$FLEET/postgres.log")"
  tls_make "$FLEET/tls"
  export DENV_CA_FILE="$FLEET/tls/ca.pem" CURL_CA_BUNDLE="$FLEET/tls/ca.pem"
  export DENV_API_KEY="dak_fleet_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  SECRET="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  PA="$(free_port)"; PB="$(free_port)"; PL="$(free_port)"
  export DENV_SERVER="https://127.0.0.1:$PL"
  start_replica() { # start_replica NAME PORT
    (cd "$FLEET" && DENV_BOOTSTRAP_KEY="$DENV_API_KEY" DENV_TLS_CERT="$FLEET/tls/cert.pem" DENV_TLS_KEY="$FLEET/tls/key.pem" \
      DENV_REPLICA_URL="https://127.0.0.1:$2" DENV_REPLICA_CA_FILE="$FLEET/tls/ca.pem" DENV_REPLICA_SECRET="$SECRET" DENV_LEASE_TTL=6s DENV_RESUME_WAIT=60 \
      exec denv-cp -addr "127.0.0.1:$2" -db "$DSN" -public-url "$DENV_SERVER" >>"$FLEET/cp-$1.log" 2>&1) &
    echo $! >"$FLEET/cp-$1.pid"
    wait_for 60 "replica $1 answers /health" curl -fsS -o /dev/null "https://127.0.0.1:$2/health"
  }
  start_replica a "$PA"
  start_replica b "$PB"
  (exec python3 "$E2E/fleet/lb.py" "$PL" "$PA" "$PB" >"$FLEET/lb.log" 2>&1) &
  echo $! >"$FLEET/lb.pid"
  wait_for 10 "the balancer listens" grep -q 'lb listening' "$FLEET/lb.log"

  # --- Three hosts: dir, btrfs, zfs.
  bash "$E2E/lib/btrfs.sh" mount /var/lib/denv-btrfs 8G >/dev/null
  mkdir -p "$BTRFS_DATA"
  zfs_pool_create "$ZPOOL" "${E2E_ZFS_SIZE:-4G}" >/dev/null
  local extra i token
  for i in 1 2 3; do
    extra=()
    [ $i = 2 ] && extra=(--btrfs)
    [ $i = 3 ] && extra=(--zfs-pool "$ZPOOL")
    token="$(denv host join-token | json_get "d['token']")"
    (exec denvd join --server "$DENV_SERVER" --ca-file "$DENV_CA_FILE" --token "$token" --state "$FLEET/host$i.json" \
        --data "${HOST_DATA[$((i-1))]}" "${extra[@]}" >"$FLEET/denvd-$i.log" 2>&1) &
    echo $! >"$FLEET/denvd-$i.pid"
  done
  three_connected() { [ "$(denv host list | json_get "sum(1 for h in d['hosts'] if h['connected'])")" = 3 ]; }
  wait_for 60 "three hosts connected" three_connected
  H1=$(json_get "d['host_id']" <"$FLEET/host1.json"); H2=$(json_get "d['host_id']" <"$FLEET/host2.json"); H3=$(json_get "d['host_id']" <"$FLEET/host3.json")
  # Both replicas hold some stream (the balancer alternates): say which.
  echo "streams: $(psql_q "select id || '@' || coalesce(replica_id,'') from hosts" | tr '\n' ' ')"

  # --- 1. The quickstart with the CLI, over https.
  denv project create --kind rl-environment quickstart >/dev/null
  cp "$E2E/fixtures/quickstart.compose.yaml" compose.yaml
  denv deploy --project quickstart -f compose.yaml --wait >/dev/null
  ENV=$(env_id quickstart alpha)
  assert_eq "$(denv env get $ENV | json_get "d['environment']['Status']")" healthy "quickstart alpha status"
  assert_eq "$(exec_out $ENV box sh -c 'id -u; echo 42 > /home/agent/answer.txt')" 1000 "agent uid"
  denv exec --service db $ENV -- psql -U postgres -c "create table t(x int); insert into t values (1)" >/dev/null
  denv snapshot $ENV >/dev/null
  denv fork --name branch-1 $ENV >/dev/null
  BRANCH=$(env_id quickstart branch-1)
  assert_eq "$(exec_out $BRANCH db psql -U postgres -tAc 'select count(*) from t')" 1 "rows in the CLI's fork"
  OUT=$(denv verify --resume $ENV); assert_contains "$OUT" "reward: 1" "CLI verify"
  QVER=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
  # ... and with the Python client: a sandbox of the version, exec, verify.
  py_denv_make "$FLEET/py" >/dev/null
  OUT=$(py_denv "$FLEET/py" - "$QVER" <<'EOF'
import sys, denv
c = denv.Client()
sb = c.sandbox(from_version=sys.argv[1], name="py-1", timeout_sec=300)
r = c.exec(sb.id, "db", ["psql", "-U", "postgres", "-tAc", "select count(*) from t"])
print("rows", r.stdout.strip())
v = c.verify(sb.id, resume=True)
print("reward", int(v.reward))
c.destroy(sb.id)
EOF
)
  assert_contains "$OUT" "rows 1" "Python fork rows"
  assert_contains "$OUT" "reward 1" "Python verify"

  # --- 2. 24 forks of one version, at once, spread over the three hosts.
  denv project create grpo >/dev/null
  printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["w:/work"]\nvolumes: { w: {} }\n' > g.yaml
  denv deploy --project grpo -f g.yaml --wait >/dev/null
  G=$(env_id grpo alpha)
  exec_out $G box sh -c 'echo seed-42 > /work/f' >/dev/null
  denv snapshot $G >/dev/null
  GVER=$(denv env get $G | json_get "d['environment']['CurrentVersionID']")
  OUT=$(py_denv "$FLEET/py" - "$GVER" <<'EOF'
import collections, concurrent.futures, json, sys, denv
c = denv.Client()
ver = sys.argv[1]
def one(i):
    sb = c.sandbox(from_version=ver, name=f"g-{i}", timeout_sec=600)
    r = c.exec(sb.id, "box", ["cat", "/work/f"])
    return sb.id, c.get_env(sb.id).raw["HostID"], r.stdout.strip(), r.exit_code
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    got = list(pool.map(one, range(24)))
bad = [g for g in got if g[2] != "seed-42" or g[3] != 0]
print(json.dumps({"hosts": collections.Counter(g[1] for g in got), "bad": bad, "envs": [g[0] for g in got]}))
EOF
)
  echo "$OUT" | tail -1 > forks.json
  assert_eq "$(json_get "len(d['envs'])" <forks.json)" 24 "forks made"
  assert_eq "$(json_get "d['bad']" <forks.json)" "[]" "forks whose exec did not print the version's data"
  for h in $H1 $H2 $H3; do
    n=$(json_get "d['hosts'].get('$h', 0)" <forks.json)
    [ "$n" -ge 4 ] || die "host $h got $n of the 24 forks ($(cat forks.json))"
  done
  echo "forks per host: $(json_get "' '.join(f'{h}={n}' for h, n in sorted(d['hosts'].items()))" <forks.json)"
  # A fork on a host without the snapshot says where its data came from.
  SHIPPED=$(psql_q "select count(*) from snapshot_copies where version_id = '$GVER'")
  [ "$SHIPPED" -ge 2 ] || die "the version's snapshot was shipped to $SHIPPED hosts, want the two that lacked it"

  # --- 3. Replica A dies while a deploy it runs is under way.
  denv project create crash >/dev/null
  printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    healthcheck: { test: ["CMD-SHELL", "sleep 6"], interval: 1s, retries: 30 }\n' > slow.yaml
  DEP=$(DENV_SERVER="https://127.0.0.1:$PA" denv deploy --project crash -f slow.yaml --wait=false | json_get "d['deployment']['ID']")
  [ -n "$DEP" ] || die "no deployment id from the deploy through replica A"
  # Mid-deploy: placed, and a later phase (prepare, start, health) running.
  at_start() { [ "$(denv deployment get "$DEP" | json_get "sum(1 for p in d['phases'] if p['Name'] in ('prepare','start','health') and p['Status']=='running')")" -ge 1 ]; }
  wait_for 60 "the deploy through replica A reaches prepare, start or health" at_start
  echo "killing replica A during: $(denv deployment get "$DEP" | json_get "[p['Name'] for p in d['phases'] if p['Status']=='running']")"
  kill -9 "$(cat "$FLEET/cp-a.pid")"
  FINAL=""
  for _ in $(seq 1 180); do
    # (a connection the balancer handed to the dying replica may fail: ask again)
    FINAL=$(denv deployment get "$DEP" 2>/dev/null | json_get "d['deployment']['Status']" 2>/dev/null) || FINAL=unanswered
    case "$FINAL" in succeeded|failed) break ;; esac
    sleep 1
  done
  case "$FINAL" in succeeded|failed) ;; *) die "the deploy of the killed replica is still '$FINAL' after 180 s" ;; esac
  echo "deploy $DEP after replica A died: $FINAL"
  start_replica a "$PA"

  # --- 4. A host's denvd dies while a fork runs on it, and comes back.
  # (the quickstart world: its fork waits seconds for PostgreSQL, so the kill lands mid-fork)
  denv fork --name crash-fork "$ENV" >fork.out 2>&1 &
  FPID=$!
  CF=""
  for _ in $(seq 1 100); do
    CF=$(denv project envs quickstart | json_get "[e['ID'] for e in d['environments'] if e['Name']=='crash-fork'] or ['']" | tr -d "[]'")
    [ -n "$CF" ] && break; sleep 0.1
  done
  [ -n "$CF" ] || die "the fork's environment did not appear"
  CFDEP=$(denv env deployments "$CF" | json_get "d['deployments'][0]['ID']")
  # Mid-fork: a host has received the fork's env.fork command (each denvd logs its
  # commands; the fork may be placed on a host other than its version's).
  CI=""
  on_host() { for i in 1 2 3; do grep -q "kind=env.fork env_id=$CF" "$FLEET/denvd-$i.log" && CI=$i && return 0; done; return 1; }
  wait_for 120 "a host receives the fork's env.fork" on_host
  CH=$(json_get "d['host_id']" <"$FLEET/host$CI.json")
  echo "killing the denvd of $CH during: $(denv deployment get "$CFDEP" | json_get "[p['Name'] for p in d['phases'] if p['Status']=='running']")"
  kill -9 "$(cat "$FLEET/denvd-$CI.pid")"
  sleep 2
  (exec denvd run --state "$FLEET/host$CI.json" >>"$FLEET/denvd-$CI.log" 2>&1) &
  echo $! >"$FLEET/denvd-$CI.pid"
  wait "$FPID" || true
  fork_ended() { case "$(denv deployment get "$CFDEP" | json_get "d['deployment']['Status']")" in succeeded|failed) return 0 ;; esac; return 1; }
  wait_for 180 "the fork on the killed host ends" fork_ended
  echo "fork $CFDEP on the killed host: $(denv deployment get "$CFDEP" | json_get "d['deployment']['Status'] + (': ' + d['deployment']['Error'] if d['deployment']['Error'] else '')")"

  # --- 5. Destroy everything; nothing may be left.
  for e in $(psql_q "select id from environments where status not in ('destroyed')"); do
    denv env destroy "$e" >/dev/null 2>&1 || true
  done
  all_destroyed() { [ "$(psql_q "select count(*) from environments where status <> 'destroyed'")" = 0 ]; }
  wait_for 300 "every environment destroyed" all_destroyed
  assert_eq "$(psql_q "select count(*) from deployments where status in ('pending','running')")" 0 "deployments still running"
  local left="" id x
  for id in $(psql_q "select id from environments"); do
    for x in $(docker ps -a --filter "label=denv.env=$id" --format '{{.Names}}'); do left+=" container:$x"; done
    for x in $(docker network ls --filter "label=denv.env=$id" --format '{{.Name}}'); do left+=" network:$x"; done
  done
  # (snaps/ too: the copies shipped to other hosts go with the environment they are of)
  for d in "${HOST_DATA[@]}"; do for x in "$d"/envs/* "$d"/snaps/*; do [ -e "$x" ] && left+=" $x"; done; done
  [ -z "$left" ] || die "left behind:$left"

  # --- No ERROR line in any log but those the kills provoke on purpose.
  local errs
  errs="$(grep -HE '^[^ ]+ +ERROR ' "$FLEET"/cp-*.log "$FLEET"/denvd-*.log | grep -vE "$ALLOWED_ERRORS" || true)"
  [ -z "$errs" ] || die "unexpected ERROR lines in the logs:
$errs"
}

( scenario ) >"$FLEET/scenario.log" 2>&1
rc=$?
secs=$(( $(date +%s) - T0 ))
if [ $rc = 0 ]; then
  echo "PASS fleet (${secs}s)"
  grep -E '^(streams|forks|killing|deploy|fork)[: ]' "$FLEET/scenario.log" | sed 's/^/    /'
else
  echo "FAIL fleet (${secs}s)"
  { tail -n 40 "$FLEET/scenario.log"; logs; } | sed 's/^/    /'
  keep="${E2E_KEEP_LOGS:-/tmp/denv-e2e-failed}/fleet"
  rm -rf "$keep"; mkdir -p "$keep" && cp "$FLEET"/*.log "$keep"/ 2>/dev/null && echo "    whole logs kept in $keep"
  { psql_q "select id, status, host_id from environments order by id"
    psql_q "select d.id, d.kind, d.status, d.env_id, p.name, p.status, p.evidence from deployments d join phases p on p.deployment_id = d.id where d.kind = 'destroy' and p.name = 'teardown' order by d.id"
    psql_q "select id, host_id, env_id, status, error, created_at from commands order by created_at"
  } >"$keep/db.txt" 2>&1
fi
teardown
echo "fleet: $((rc == 0 ? 1 : 0)) passed, $((rc == 0 ? 0 : 1)) failed"
exit $rc
