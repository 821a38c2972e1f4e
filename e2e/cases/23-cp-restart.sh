# A control plane killed (-9) in the middle of a deploy, a fork and a verify: the next
# one resumes each deployment, each ends with what the host actually did (the commands
# it had sent are answered by the host's journal, none runs twice), and nothing is left
# running that nobody owns. Then a SIGTERM drains a running deployment before exiting.
# allow-error: response failed classification=Status code: 503 Service Unavailable
# shellcheck source=../lib/procs.sh
source "$E2E/lib/procs.sh"
containers_of() { docker ps -aq --filter "label=denv.env=$1" | wc -l | tr -d ' '; }
no_containers() { [ "$(containers_of "$1")" = 0 ]; }
started_events() { denv events "dep:$1" | grep -c '"deployment.started"' || true; }
resumed() { grep -q '"resumed":true' <<<"$(denv events "dep:$1" | tr -d ' ')"; }
# kill_during <deployment> <phase>: kill -9 the control plane while the phase runs (a
# second after it started), then start a new one.
kill_during() {
  wait_for 60 "$1 reaches $2" phase_is "$1" "$2" running
  sleep 1
  phase_is "$1" "$2" running || die "$2 of $1 ended before the kill"
  kill_cp
  start_cp
}

cat > world.yaml <<'YAML'
x-denv:
  agent: { service: box }
  verifier:
    image: busybox:1.36
    command: ["sh", "-c", "sleep 5; [ \"$(cat /submission/home/agent/answer.txt)\" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt"]
    collect: ["/home/agent/answer.txt"]
services:
  slow:
    image: busybox:1.36
    command: ["sh", "-c", "sleep 5; touch /tmp/ok; sleep 1000000"]
    healthcheck: { test: ["CMD", "test", "-f", "/tmp/ok"], interval: 1s, retries: 60 }
    volumes: ["w:/w"]
  box:
    image: python:3.12-slim
    user: "1000:1000"
    command: ["sleep", "infinity"]
    environment: { HOME: /home/agent }
    volumes: ["home:/home/agent"]
volumes: { w: {}, home: {} }
YAML
denv project create crash >/dev/null

# --- 1. A deploy: killed while its stack comes up (prepare sends env.create, which waits
# for `slow` to be healthy).
DEP=$(denv deploy --project crash -f world.yaml --wait=false | json_get "d['deployment']['ID']")
ENV=$(denv deployment get "$DEP" | json_get "d['deployment']['EnvID']")
kill_during "$DEP" prepare
wait_for 120 "the resumed deploy ends" dep_is "$DEP" succeeded
resumed "$DEP" || die "deployment.started of the resumed run does not say resumed"
assert_eq "$(started_events "$DEP")" 2 "deployment.started events of $DEP"
assert_eq "$(denv env get "$ENV" | json_get "d['environment']['Status']")" healthy "the deployed environment"
assert_eq "$(containers_of "$ENV")" 2 "containers of $ENV (one stack, not two)"
exec_out "$ENV" box sh -c 'echo 42 > /home/agent/answer.txt' >/dev/null
assert_eq "$(exec_out "$ENV" box cat /home/agent/answer.txt)" 42 "exec in the resumed deploy"

# --- 2. A fork: killed while the fork's services start (clone).
FDEP=$(denv fork --wait=false "$ENV" | json_get "d['deployment']['ID']")
FORK=$(denv deployment get "$FDEP" | json_get "d['deployment']['EnvID']")
kill_during "$FDEP" clone
wait_for 120 "the resumed fork ends" dep_is "$FDEP" succeeded
resumed "$FDEP" || die "the fork's resumed run does not say resumed"
assert_eq "$(denv env get "$FORK" | json_get "d['environment']['Status']")" healthy "the fork"
assert_eq "$(containers_of "$FORK")" 2 "containers of the fork (one stack, not two)"
assert_eq "$(exec_out "$FORK" box id -u)" 1000 "exec in the resumed fork"

# --- 3. A verify: killed while the grader runs (grade sleeps 5 s first).
api POST "/v1/envs/$ENV/verify" -H 'Content-Type: application/json' -d '{}'
assert_eq "$API_STATUS" 202 "verify: $API_BODY"
VDEP=$(printf '%s' "$API_BODY" | json_get "d['deployment']['ID']")
kill_during "$VDEP" grade
wait_for 120 "the resumed verify ends" dep_is "$VDEP" succeeded
resumed "$VDEP" || die "the verify's resumed run does not say resumed"
V=$(denv deployment get "$VDEP")
assert_eq "$(json_get "[p['Evidence']['reward'] for p in d['phases'] if p['Name']=='verdict'][0]" <<<"$V")" 1 "the reward of the resumed verify"
GRADER=$(json_get "d['deployment']['TargetEnvID']" <<<"$V")
[ -n "$GRADER" ] || die "no grader environment: $V"
wait_destroyed "$GRADER"
wait_for 30 "the grader's containers are removed" no_containers "$GRADER"
# Exactly one grader environment was made for the verify.
GRADERS=$(denv env list --project crash --json -a | json_get "len([e for e in d['environments'] if e['Stage']=='verify'])")
assert_eq "$GRADERS" 1 "grader environments of the project"

# --- 4. SIGTERM drains: a fork running when the control plane is told to stop ends
# before it exits; a deployment asked for meanwhile is refused with 503.
DDEP=$(denv fork --wait=false "$ENV" | json_get "d['deployment']['ID']")
DFORK=$(denv deployment get "$DDEP" | json_get "d['deployment']['EnvID']")
wait_for 60 "$DDEP reaches clone" phase_is "$DDEP" clone running
kill -TERM "$(cat "$STACK_DIR/cp.pid")"
sleep 0.5
api POST "/v1/envs/$ENV/snapshot" -H 'Content-Type: application/json' -d '{}'
assert_eq "$API_STATUS" 503 "a deployment asked for while draining: $API_BODY"
assert_contains "$API_BODY" "the control plane is stopping" "the drain's refusal"
wait_for 60 "denv-cp exits after its drain" sh -c "! kill -0 $(cat "$STACK_DIR/cp.pid") 2>/dev/null"
start_cp
# The host reconnects to the new process before anything else is asked of it (a destroy
# while it is away would be torn down only on its return, after this case's end).
wait_for 60 "the host reconnects" is_connected True
assert_eq "$(denv deployment get "$DDEP" | json_get "d['deployment']['Status']")" succeeded "the drained fork"
resumed "$DDEP" && die "the drained fork was resumed: it ended before the exit"
assert_eq "$(containers_of "$DFORK")" 2 "containers of the drained fork"

for e in "$DFORK" "$FORK" "$ENV"; do denv env destroy "$e" >/dev/null; done
for e in "$DFORK" "$FORK" "$ENV"; do wait_destroyed "$e"; done
for e in "$DFORK" "$FORK" "$ENV"; do
  wait_for 30 "the containers of $e are removed" no_containers "$e"
done
true
