#!/usr/bin/env bash
# The quickstart (docs/quickstart.md), steps 2-8, end to end on the local Docker
# engine, with the CLI exactly as the page shows it. Prints each step and ends with a
# one-line summary. Cleans up after itself; can be run twice in a row.
set -euo pipefail
E2E="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/stack.sh
source "$E2E/lib/stack.sh"
STORAGE_FLAG="${1:-}"

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { echo "DEMO FAILED: $*" >&2; stack_logs >&2; exit 1; }
trap 'stack_down' EXIT

step "2-3. start a control plane and connect this machine"
STACK_KEY=dak_local stack_up $STORAGE_FLAG || fail "stack did not start"
denv whoami
denv host list

WORK="$(mktemp -d)"; cd "$WORK"
step "4. describe the environment"
denv project create --kind rl-environment quickstart >/dev/null
cat > compose.yaml <<'YAML'
x-denv:
  kind: rl-environment
  agent:
    service: box
  verifier:
    image: busybox:1.36
    command: ["sh", "-c", "[ \"$(cat /submission/home/agent/answer.txt)\" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"]
    collect: ["/home/agent/answer.txt"]
services:
  db:
    image: postgres:16-alpine
    environment: { POSTGRES_PASSWORD: world }
    volumes: ["pg:/var/lib/postgresql/data"]
    healthcheck: { test: ["CMD-SHELL", "pg_isready -U postgres"], interval: 2s, retries: 30 }
  box:
    image: python:3.12-slim
    user: "1000:1000"
    command: ["sleep", "infinity"]
    environment: { HOME: /home/agent, PGHOST: db, PGPASSWORD: world }
    volumes: ["home:/home/agent"]
    depends_on: [db]
volumes: { pg: {}, home: {} }
YAML
cat compose.yaml

step "5. deploy"
denv deploy --project quickstart -f compose.yaml --wait || fail "deploy failed"
ENV=$(denv project envs quickstart | python3 -c 'import json,sys;print([e for e in json.load(sys.stdin)["environments"] if e["Name"]=="alpha"][0]["ID"])')
denv env get $ENV

step "6. act as the agent, then fork"
UID_OUT=$(denv exec --service box $ENV -- sh -c 'id -u; echo 42 > /home/agent/answer.txt')
echo "$UID_OUT"
AGENT_UID=$(echo "$UID_OUT" | python3 -c 'import json,sys;print(json.load(sys.stdin)["stdout"].strip())')
[ "$AGENT_UID" = 1000 ] || fail "agent uid is $AGENT_UID, want 1000"
denv exec --service db $ENV -- psql -U postgres -c "create table t(x int); insert into t values (1)"
denv snapshot $ENV || fail "snapshot failed"
denv fork --name branch-1 $ENV || fail "fork failed"
BRANCH=$(denv project envs quickstart | python3 -c 'import json,sys;print([e for e in json.load(sys.stdin)["environments"] if e["Name"]=="branch-1"][0]["ID"])')
ROWS_OUT=$(denv exec --service db $BRANCH -- psql -U postgres -tAc "select count(*) from t")
echo "$ROWS_OUT"
ROWS=$(echo "$ROWS_OUT" | python3 -c 'import json,sys;print(json.load(sys.stdin)["stdout"].strip())')
[ "$ROWS" = 1 ] || fail "fork sees $ROWS rows, want 1"

step "7. grade"
VERIFY1=$(denv verify $ENV) || fail "verify failed"
echo "$VERIFY1"
[[ "$VERIFY1" == *'reward: 1'* ]] || fail "verify did not give reward: 1"
denv verify --resume $ENV >/dev/null || fail "verify --resume failed"
denv exec --service box $ENV -- sh -c 'ln -sf /etc/passwd /home/agent/answer.txt'
VERIFY2=$(denv verify --resume $ENV) || fail "attack verify failed"
echo "$VERIFY2"
[[ "$VERIFY2" == *'reward: 0'* ]] || fail "attack did not give reward: 0"
[[ "$VERIFY2" == *'source: refused'* ]] || fail "attack was not refused"
[[ "$VERIFY2" == *'home/agent/answer.txt: symlink'* ]] || fail "attack reason missing"

step "8. clean up"
denv env destroy $BRANCH
denv env destroy $ENV
for _ in $(seq 1 60); do
  S1=$(denv env get $BRANCH | python3 -c 'import json,sys;print(json.load(sys.stdin)["environment"]["Status"])')
  S2=$(denv env get $ENV | python3 -c 'import json,sys;print(json.load(sys.stdin)["environment"]["Status"])')
  [ "$S1" = destroyed ] && [ "$S2" = destroyed ] && break
  sleep 1
done
[ "$S1" = destroyed ] && [ "$S2" = destroyed ] || fail "environments not destroyed ($S1, $S2)"
LEFT=$( (docker ps -aq --filter "label=denv.env=$ENV"; docker ps -aq --filter "label=denv.env=$BRANCH") | wc -l)
[ "$LEFT" = 0 ] || fail "$LEFT containers left behind"
cd / && rm -rf "$WORK"

echo
echo "quickstart OK: deployed, agent uid 1000, fork saw 1 row, verify reward 1, symlink attack reward 0 (refused), both environments destroyed"
