#!/usr/bin/env bash
# Smoke test of the local stand-in images (e2e/images/build.sh): runs each one
# briefly and asserts what the quickstart and the docs' examples need.
# Everything it creates is named denv-smoke-<pid>-* and removed on exit.
#
#   e2e/images/smoke.sh [busybox|postgres|python|redis|ubuntu]...
#
# Exit status 0 iff every check passed.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/../lib/common.sh"

P=denv-smoke-$$
FAILS=0
PASSES=0
CANARY_UP=0

cleanup() {
    local ids
    ids=$(docker ps -aq --filter "name=^/$P-")
    # shellcheck disable=SC2086 # word splitting intended: one id per word
    [ -n "$ids" ] && docker rm -f $ids >/dev/null 2>&1
    ids=$(docker volume ls -q --filter "name=^$P-")
    # shellcheck disable=SC2086
    [ -n "$ids" ] && docker volume rm $ids >/dev/null 2>&1
    ids=$(docker network ls -q --filter "name=^$P-")
    # shellcheck disable=SC2086
    [ -n "$ids" ] && docker network rm $ids >/dev/null 2>&1
    [ "$CANARY_UP" = 1 ] && "$HERE/../lib/canary.sh" down "$P-c" >/dev/null 2>&1
    return 0
}
trap cleanup EXIT

# check NAME EXPECTED ACTUAL
check() {
    if [ "$2" = "$3" ]; then
        PASSES=$((PASSES + 1))
        printf 'ok    %s\n' "$1"
    else
        FAILS=$((FAILS + 1))
        printf 'FAIL  %s: expected %q, got %q\n' "$1" "$2" "$3"
    fi
}

# wait_for SECONDS CMD... — retry CMD every 0.5 s; true if it succeeded in time.
wait_for() {
    local deadline=$(( $(date +%s) + $1 ))
    shift
    while [ "$(date +%s)" -lt "$deadline" ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    return 1
}

probe() { # NETWORK URL -> REACHED|BLOCKED (a 4 s timeout, like the egress probe)
    docker run --rm --network "$1" busybox:1.36 \
        sh -c "wget -q -T 4 -O /dev/null $2 2>/dev/null && echo REACHED || echo BLOCKED"
}

smoke_busybox() {
    log "busybox:1.36"
    check "busybox: applets" "ok" \
        "$(docker run --rm busybox:1.36 sh -c 'for a in wget sh cat echo mkdir nc timeout; do command -v $a >/dev/null || exit 1; done; echo ok')"
    check "busybox: wget has -T" "yes" \
        "$(docker run --rm busybox:1.36 sh -c 'wget --help 2>&1 | grep -q -- "-T SEC" && echo yes')"
    check "busybox: nobody user" "65534" "$(docker run --rm --user nobody busybox:1.36 id -u)"
    check "busybox: /tmp is 1777" "1777" "$(docker run --rm busybox:1.36 stat -c %a /tmp)"

    docker network create --internal "$P-int" >/dev/null
    docker network create "$P-ext" >/dev/null
    local url
    if url=$("$HERE/../lib/canary.sh" up "$P-c" 198.18.254.2); then
        CANARY_UP=1
        check "egress: open network reaches the canary (control)" REACHED "$(probe "$P-ext" "$url")"
        check "egress: internal network cannot reach the canary" BLOCKED "$(probe "$P-int" "$url")"
    else
        check "egress: canary starts" up down
    fi
    check "egress: internal network blocks wget http://1.1.1.1/" BLOCKED "$(probe "$P-int" http://1.1.1.1/)"
    local t0 dt
    t0=$(date +%s)
    probe "$P-int" http://1.1.1.1/ >/dev/null
    dt=$(( $(date +%s) - t0 ))
    check "egress: wget -T 4 gives up within 8 s" yes "$([ "$dt" -le 8 ] && echo yes || echo "no (${dt}s)")"
}

smoke_postgres() {
    log "postgres:16-alpine"
    docker network create "$P-pg" >/dev/null
    docker run -d --name "$P-db" --network "$P-pg" --network-alias db \
        -e POSTGRES_PASSWORD=world -v "$P-pg:/var/lib/postgresql/data" postgres:16-alpine >/dev/null
    local t0 ok=no
    t0=$(date +%s)
    if wait_for 60 docker exec "$P-db" pg_isready -U postgres &&
        wait_for 60 docker exec "$P-db" psql -U postgres -tAc 'select 1'; then ok=yes; fi
    check "postgres: ready within 60 s ($(( $(date +%s) - t0 ))s)" yes "$ok"
    check "postgres: psql select 1" 1 "$(docker exec "$P-db" psql -U postgres -tAc 'select 1')"
    check "postgres: runs as postgres" postgres "$(docker exec "$P-db" sh -c 'ps -o user= -p 1 2>/dev/null || stat -c %U /proc/1')"
    check "postgres: listens on *" "*" "$(docker exec "$P-db" psql -U postgres -tAc 'show listen_addresses')"
    docker exec "$P-db" psql -U postgres -qc 'create table t(x int); insert into t values (1)' >/dev/null
    # From another container, the way the quickstart's box connects.
    check "postgres: password login over TCP from python:3.12-slim as 1000:1000" 1 \
        "$(docker run --rm --network "$P-pg" --user 1000:1000 -e PGHOST=db -e PGPASSWORD=world \
            python:3.12-slim psql -U postgres -tAc 'select count(*) from t')"
    check "postgres: wrong password refused" refused \
        "$(docker run --rm --network "$P-pg" -e PGHOST=db -e PGPASSWORD=nope \
            python:3.12-slim psql -U postgres -tAc 'select 1' >/dev/null 2>&1 && echo accepted || echo refused)"

    # SIGTERM, then start again on a copy of the data directory.
    docker kill -s TERM "$P-db" >/dev/null
    docker wait "$P-db" >/dev/null
    docker run --rm -v "$P-pg:/from" -v "$P-pg2:/to" busybox:1.36 cp -a /from/. /to/
    docker run -d --name "$P-db2" -e POSTGRES_PASSWORD=other -v "$P-pg2:/var/lib/postgresql/data" postgres:16-alpine >/dev/null
    ok=no
    wait_for 60 docker exec "$P-db2" psql -U postgres -tAc 'select 1' && ok=yes
    check "postgres: restarts on a copied data dir" yes "$ok"
    check "postgres: copy keeps the row" 1 "$(docker exec "$P-db2" psql -U postgres -tAc 'select count(*) from t')"
    check "postgres: no initdb on restart" 0 "$(docker logs "$P-db2" 2>&1 | grep -c 'init process complete')"
    docker start "$P-db" >/dev/null
    ok=no
    wait_for 60 docker exec "$P-db" psql -U postgres -tAc 'select 1' && ok=yes
    check "postgres: docker start after SIGTERM" yes "$ok"
    check "postgres: no password -> refuses to init" 1 \
        "$(docker run --rm postgres:16-alpine >/dev/null 2>&1; echo $?)"
}

smoke_python() {
    log "python:3.12-slim"
    local out
    out=$(docker run --rm --user 1000:1000 -e HOME=/home/agent -v "$P-home:/home/agent" -v "$P-work:/work" \
        python:3.12-slim sh -c 'id -u; id -g; python3 -c "print(1)"; python -c "print(2)";
            echo hi > $HOME/f && cat $HOME/f; echo w > /work/f && cat /work/f; stat -c %a /tmp;
            ps -o pid= -p 1 | tr -d " "; command -v bash psql tar >/dev/null && echo tools;
            python3 -m venv /tmp/v >/dev/null && /tmp/v/bin/python -c "print(3)"')
    check "python: id, python3, python, \$HOME and /work writable, /tmp 1777, ps, tools, venv" \
        "$(printf '1000\n1000\n1\n2\nhi\nw\n1777\n1\ntools\n3')" "$out"
    check "python: empty named volume at /home/agent gets mode 777" 777 \
        "$(docker run --rm -v "$P-home:/h" busybox:1.36 stat -c %a /h)"
}

smoke_redis() {
    log "redis:7-alpine"
    docker network create "$P-rd" >/dev/null
    docker run -d --name "$P-redis" --network "$P-rd" --network-alias queue -v "$P-rd:/data" \
        redis:7-alpine redis-server --appendonly yes >/dev/null
    local ok=no
    wait_for 30 sh -c "docker exec $P-redis redis-cli ping | grep -q PONG" && ok=yes
    check "redis: redis-cli ping" yes "$ok"
    check "redis: PONG" PONG "$(docker exec "$P-redis" redis-cli ping)"
    check "redis: dir is /data" /data "$(docker exec "$P-redis" redis-cli config get dir | tail -1)"
    check "redis: appendonly from the command" yes "$(docker exec "$P-redis" redis-cli config get appendonly | tail -1)"
    check "redis: reachable from another container (protected mode off)" PONG \
        "$(docker run --rm --network "$P-rd" redis:7-alpine redis-cli -h queue ping)"
    docker run -d --name "$P-redis2" redis:7-alpine >/dev/null
    ok=no
    wait_for 30 sh -c "docker exec $P-redis2 redis-cli ping | grep -q PONG" && ok=yes
    check "redis: default command serves" yes "$ok"
}

smoke_ubuntu() {
    log "ubuntu:24.04"
    check "ubuntu: 1000:1000 with HOME volume" "$(printf 'ubuntu\nok\n1')" \
        "$(docker run --rm --user 1000:1000 -e HOME=/home/ubuntu -v "$P-uhome:/home/ubuntu" ubuntu:24.04 \
            bash -c 'id -un; echo ok > ~/a && cat ~/a; ps -o pid= -p 1 | tr -d " "')"
}

WANT=("$@")
[ "${#WANT[@]}" -eq 0 ] && WANT=(busybox postgres python redis ubuntu)
docker_ready || die "docker is not running (e2e/setup-host.sh)"
T0=$(date +%s)
for w in "${WANT[@]}"; do
    case "$w" in
        busybox|postgres|python|redis|ubuntu) "smoke_$w" ;;
        *) die "unknown image: $w" ;;
    esac
done
echo "smoke: $PASSES passed, $FAILS failed in $(( $(date +%s) - T0 ))s"
[ "$FAILS" -eq 0 ]
