#!/usr/bin/env bash
# A fleet of real machines on one box (issues #16 and #26): two denv-cp replicas on one
# PostgreSQL, serving TLS, behind a TCP load balancer (lb.py) on the fleet link's
# address 10.231.0.1; host A's denvd on this machine's engine (dir storage); hosts B
# (btrfs) and C (zfs) each in its own network namespace with its own, empty Docker
# engine (e2e/lib/fleet-net.sh), reaching the control plane and each other over a
# veth + bridge link. Every denvd has a data port. Then, all over https:
#   1. on host A alone: the quickstart (deploy, exec, a row, snapshot) and a version
#      holding 64 MiB of random data and a 1 GiB sparse file; replica A is killed
#      (SIGKILL) while a deploy it runs is under way, and replica B takes it over;
#   2. B and C join; the quickstart is forked with the CLI and from the Python client
#      and verified (reward 1), wherever the forks land;
#   3. 24 forks of the data version at once: each host gets some, each answers exec
#      with the version's data; B and C fetched the version's images (by id) and its
#      snapshot from host A, host to host: the replicas' read bytes grew by far less
#      than the data shipped; the sparse file arrived sparse;
#   4. a host's denvd is killed (SIGKILL) while a fork runs on it, then started again;
#      B's engine is stopped and C's link cut for 60 s while forks of the data version
#      run on every host: each ends with a recorded outcome;
#   5. everything is destroyed, and nothing of any environment is left on any of the
#      three engines or data directories; no deployment still running; no ERROR line in
#      any log but those the faults provoke.
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
# shellcheck source=../lib/fleet-net.sh
source "$E2E/lib/fleet-net.sh"
GW=$FLEET_GW

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
  pkill -9 -f -- "--state $FLEET/host" 2>/dev/null
  # Hosts B and C: their engines, containers and namespaces go whole.
  fleet_down b >/dev/null 2>&1; fleet_down c >/dev/null 2>&1; fleet_down_all >/dev/null 2>&1
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

# start_host I: host I's denvd (joining the first time, `run` after), on this machine
# (I=1) or in fleet host b/c's namespace with its engine (I=2, 3), with a data port.
HOST_NAME=("" a b c)
HOST_ADDR=("" "$GW" "$FLEET_PREFIX.12" "$FLEET_PREFIX.13")
start_host() {
  local i=$1 extra=() args
  [ "$i" = 2 ] && extra=(--btrfs)
  [ "$i" = 3 ] && extra=(--zfs-pool "$ZPOOL")
  if [ -f "$FLEET/host$i.json" ] && grep -q host_id "$FLEET/host$i.json"; then
    args=(run --state "$FLEET/host$i.json")
  else
    args=(join --server "$DENV_SERVER" --ca-file "$DENV_CA_FILE" --token "$(denv host join-token | json_get "d['token']")" \
      --state "$FLEET/host$i.json" --data "${HOST_DATA[$((i-1))]}" "${extra[@]}")
  fi
  args+=(--data-addr "${HOST_ADDR[$i]}:$((7700 + i))")
  if [ "$i" = 1 ]; then
    (exec denvd "${args[@]}" >>"$FLEET/denvd-$i.log" 2>&1) &
  else
    # (killed on purpose later: not a failure of the scenario)
    (trap - ERR; set +e; fleet_exec "${HOST_NAME[$i]}" "$(command -v denvd)" "${args[@]}" >>"$FLEET/denvd-$i.log" 2>&1) &
  fi
}
kill_host() { pkill -9 -f -- "--state $FLEET/host$1.json"; }
connected_hosts() { [ "$(denv host list | json_get "sum(1 for h in d['hosts'] if h['connected'])")" = "$1" ]; }
# The bytes the control-plane replicas have received from and sent to every client and
# sidecar so far (counted by the balancer, which all of them go through).
cp_bytes() { sleep 1; awk '{print $1 + $2}' "$FLEET/lb.bytes"; }

scenario() {
  set -eE
  trap 'echo "fleet: failed at line $LINENO: $BASH_COMMAND"' ERR
  cd "$FLEET"
  # --- PostgreSQL, a CA, the replicas and the balancer.
  DSN="$(bash "$E2E/lib/postgres.sh" start "$PGDIR" 2>>"$FLEET/postgres.log")"
  fleet_net_up || die "the fleet link did not come up"
  TLS_EXTRA_SAN="IP:$GW" tls_make "$FLEET/tls"
  export DENV_CA_FILE="$FLEET/tls/ca.pem" CURL_CA_BUNDLE="$FLEET/tls/ca.pem"
  export DENV_API_KEY="dak_fleet_$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  SECRET="$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  PA="$(free_port)"; PB="$(free_port)"; PL="$(free_port)"
  export DENV_SERVER="https://$GW:$PL"
  start_replica() { # start_replica NAME PORT
    (cd "$FLEET" && DENV_BOOTSTRAP_KEY="$DENV_API_KEY" DENV_TLS_CERT="$FLEET/tls/cert.pem" DENV_TLS_KEY="$FLEET/tls/key.pem" \
      DENV_REPLICA_URL="https://127.0.0.1:$2" DENV_REPLICA_CA_FILE="$FLEET/tls/ca.pem" DENV_REPLICA_SECRET="$SECRET" DENV_LEASE_TTL=6s DENV_RESUME_WAIT=60 \
      exec denv-cp -addr "127.0.0.1:$2" -db "$DSN" -public-url "$DENV_SERVER" >>"$FLEET/cp-$1.log" 2>&1) &
    echo $! >"$FLEET/cp-$1.pid"
    wait_for 60 "replica $1 answers /health" curl -fsS -o /dev/null "https://127.0.0.1:$2/health"
  }
  start_replica a "$PA"
  start_replica b "$PB"
  (LB_BYTES_FILE="$FLEET/lb.bytes" exec python3 "$E2E/fleet/lb.py" "$GW:$PL" "$PA" "$PB" >"$FLEET/lb.log" 2>&1) &
  echo $! >"$FLEET/lb.pid"
  wait_for 10 "the balancer listens" grep -q 'lb listening' "$FLEET/lb.log"

  # --- Host A: this machine's engine, dir storage. B and C join later.
  bash "$E2E/lib/btrfs.sh" mount /var/lib/denv-btrfs 8G >/dev/null
  mkdir -p "$BTRFS_DATA"
  zfs_pool_create "$ZPOOL" "${E2E_ZFS_SIZE:-4G}" >/dev/null
  start_host 1
  wait_for 60 "host A connected" connected_hosts 1
  H1=$(json_get "d['host_id']" <"$FLEET/host1.json")

  # --- 1. On host A alone: the quickstart, a version with data, a replica's death.
  denv project create --kind rl-environment quickstart >/dev/null
  cp "$E2E/fixtures/quickstart.compose.yaml" compose.yaml
  denv deploy --project quickstart -f compose.yaml --wait >/dev/null
  ENV=$(env_id quickstart alpha)
  assert_eq "$(denv env get $ENV | json_get "d['environment']['Status']")" healthy "quickstart alpha status"
  assert_eq "$(exec_out $ENV box sh -c 'id -u; echo 42 > /home/agent/answer.txt')" 1000 "agent uid"
  denv exec --service db $ENV -- psql -U postgres -c "create table t(x int); insert into t values (1)" >/dev/null
  denv snapshot $ENV >/dev/null
  QVER=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
  denv project create grpo >/dev/null
  printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["w:/work"]\nvolumes: { w: {} }\n' > g.yaml
  denv deploy --project grpo -f g.yaml --wait >/dev/null
  G=$(env_id grpo alpha)
  # 64 MiB of random data, and a 1 GiB file of which 4 bytes are written.
  exec_out $G box sh -c 'echo seed-42 > /work/f; head -c 67108864 /dev/urandom > /work/blob; md5sum /work/blob > /work/blob.md5; truncate -s 1073741824 /work/sparse; echo end >> /work/sparse' >/dev/null
  denv snapshot $G >/dev/null
  GVER=$(denv env get $G | json_get "d['environment']['CurrentVersionID']")

  # Replica A dies while a deploy it runs is under way.
  denv project create crash >/dev/null
  printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    healthcheck: { test: ["CMD-SHELL", "sleep 6"], interval: 1s, retries: 30 }\n' > slow.yaml
  DEP=$(DENV_SERVER="https://127.0.0.1:$PA" denv deploy --project crash -f slow.yaml --wait=false | json_get "d['deployment']['ID']")
  [ -n "$DEP" ] || die "no deployment id from the deploy through replica A"
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

  # --- 2. Hosts B and C: own namespaces, own empty engines.
  local t0; t0=$(date +%s)
  # (fleet-net's functions report failures by status, not under set -e: checked here)
  fleet_up b 2 >/dev/null || die "fleet host b did not come up"
  fleet_up c 3 >/dev/null || die "fleet host c did not come up"
  for n in b c; do
    [ -z "$(fleet_exec $n docker images -q)" ] || die "host $n's engine is not empty"
  done
  start_host 2; start_host 3
  wait_for 90 "three hosts connected" connected_hosts 3
  echo "hosts B and C up and joined in $(( $(date +%s) - t0 ))s"
  H2=$(json_get "d['host_id']" <"$FLEET/host2.json"); H3=$(json_get "d['host_id']" <"$FLEET/host3.json")
  echo "streams: $(psql_q "select id || '@' || coalesce(replica_id,'') from hosts" | tr '\n' ' ')"
  sleep 2  # every host's first load report
  denv fork --name branch-1 $ENV >/dev/null
  BRANCH=$(env_id quickstart branch-1)
  assert_eq "$(exec_out $BRANCH db psql -U postgres -tAc 'select count(*) from t')" 1 "rows in the CLI's fork"
  echo "fork branch-1 on $(denv env get $BRANCH | json_get "d['environment']['HostID']")"
  OUT=$(denv verify --resume $ENV); assert_contains "$OUT" "reward: 1" "CLI verify"
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

  # --- 3. 24 forks of the data version at once, spread over the three hosts.
  local before after shipped
  before=$(cp_bytes)
  OUT=$(py_denv "$FLEET/py" - "$GVER" <<'EOF'
import collections, concurrent.futures, json, sys, denv
c = denv.Client()
ver = sys.argv[1]
def one(i):
    sb = c.sandbox(from_version=ver, name=f"g-{i}", timeout_sec=600)
    r = c.exec(sb.id, "box", ["sh", "-c", "cat /work/f; md5sum -c /work/blob.md5 >/dev/null && echo blob-ok; du -k /work/sparse | cut -f1"])
    return sb.id, c.get_env(sb.id).raw["HostID"], r.stdout.split(), r.exit_code
with concurrent.futures.ThreadPoolExecutor(8) as pool:
    got = list(pool.map(one, range(24)))
bad = [g for g in got if g[2][:2] != ["seed-42", "blob-ok"] or int(g[2][2]) > 1024 or g[3] != 0]
print(json.dumps({"hosts": collections.Counter(g[1] for g in got), "bad": bad, "envs": [g[0] for g in got]}))
EOF
)
  after=$(cp_bytes)
  echo "$OUT" | tail -1 > forks.json
  assert_eq "$(json_get "len(d['envs'])" <forks.json)" 24 "forks made"
  assert_eq "$(json_get "d['bad']" <forks.json)" "[]" "forks whose exec did not show the version's data (or a sparse file that is not)"
  # Placement by locality and load: the group starts on A, which holds the data, and
  # spreads to B and C once waiting on A would take longer than shipping.
  for h in $H1 $H2 $H3; do
    n=$(json_get "d['hosts'].get('$h', 0)" <forks.json)
    [ "$n" -ge 1 ] || die "host $h got none of the 24 forks ($(cat forks.json))"
  done
  echo "forks per host: $(json_get "' '.join(f'{h}={n}' for h, n in sorted(d['hosts'].items()))" <forks.json)"
  # B and C got the snapshot from A (recorded copies), and the image by its id.
  assert_eq "$(psql_q "select count(*) from snapshot_copies where version_id = '$GVER' and from_host_id = '$H1'")" 2 "copies of the version shipped from host A"
  shipped=$(psql_q "select sum(bytes) from snapshot_copies where version_id = '$GVER'")
  [ "$shipped" -lt $((200 << 20)) ] || die "the version's two copies weighed $shipped bytes: the sparse file travelled whole"
  local bb; bb=$(docker image inspect -f '{{.Id}}' busybox:1.36)
  for n in b c; do
    [ "$(fleet_exec $n docker image inspect -f '{{.Id}}' "$bb")" = "$bb" ] || die "host $n's engine lacks busybox's image $bb"
  done
  echo "shipped $shipped bytes of snapshot to B and C; $((after - before)) bytes went in and out of the replicas meanwhile"
  [ $(( (after - before) * 4 )) -lt "$shipped" ] || die "$((after - before)) bytes went through the replicas while $shipped bytes were shipped: the data passed through them"

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
  kill_host "$CI"
  sleep 2
  start_host "$CI"
  wait "$FPID" || true
  ended() { case "$(denv deployment get "$1" | json_get "d['deployment']['Status']")" in succeeded|failed) return 0 ;; esac; return 1; }
  wait_for 180 "the fork on the killed host ends" ended "$CFDEP"
  echo "fork $CFDEP on the killed host: $(denv deployment get "$CFDEP" | json_get "d['deployment']['Status'] + (': ' + d['deployment']['Error'] if d['deployment']['Error'] else '')")"
  wait_for 60 "three hosts connected again" connected_hosts 3

  # B's engine stops and C's link is cut (60 s) while forks of the data version run
  # (all three hosts hold its snapshot now, so eight at once spread over them).
  local deps=() i fenvs sb sc
  # (where B's and C's logs stand before the forks: their env.fork lines come after)
  sb=$(stat -c %s "$FLEET/denvd-2.log"); sc=$(stat -c %s "$FLEET/denvd-3.log")
  for i in 1 2 3 4 5 6 7 8; do (denv fork --name "fault-$i" "$G" >/dev/null 2>&1 &); done
  all8() { fenvs=$(denv project envs grpo | json_get "' '.join(e['ID'] for e in d['environments'] if e['Name'].startswith('fault-'))"); [ "$(echo $fenvs | wc -w)" = 8 ]; }
  # The faults as soon as each host has a fork to run (its log says so).
  got_fork() { tail -c +"$2" "$FLEET/denvd-$1.log" | grep -q "kind=env.fork"; }
  wait_for 120 "host B receives a fork" got_fork 2 "$sb"
  (fleet_engine_stop b >/dev/null || exit 1) &
  local stopping=$!
  wait_for 120 "host C receives a fork" got_fork 3 "$sc"
  fleet_link_cut c >/dev/null || die "cutting host C's link failed"
  wait "$stopping" || die "stopping host B's engine failed"
  echo "stopped host B's engine and cut host C's link while the forks ran"
  wait_for 60 "the eight fault forks appear" all8
  for e in $fenvs; do deps+=("$(denv env deployments "$e" | json_get "d['deployments'][0]['ID']")"); done
  sleep 60
  fleet_link_restore c >/dev/null || die "restoring host C's link failed"
  fleet_engine_start b >/dev/null || die "starting host B's engine again failed"
  echo "restored C's link and B's engine"
  for d in "${deps[@]}"; do wait_for 300 "fault fork $d ends" ended "$d"; done
  echo "fault forks: $(for d in "${deps[@]}"; do denv deployment get "$d" | json_get "d['deployment']['Status'] + '@' + [p for p in d['phases'] if p['Name'] == 'place'][0]['Evidence'].get('host', '')[-6:]"; done | sort | uniq -c | tr -s ' \n' ' ')"
  wait_for 90 "three hosts connected after the faults" connected_hosts 3

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
  local n
  for n in b c; do
    for x in $(fleet_exec $n docker ps -a --filter label=denv.managed=true --format '{{.Names}}'); do left+=" $n:container:$x"; done
    for x in $(fleet_exec $n docker network ls --filter label=denv.managed=true --format '{{.Name}}'); do left+=" $n:network:$x"; done
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
  grep -E '^(streams|forks|killing|deploy|fork|hosts|shipped|stopped|restored|fault)[: ]' "$FLEET/scenario.log" | sed 's/^/    /'
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
