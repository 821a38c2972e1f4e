# Every environment ends, on a real engine: a destroy issued while denvd is down completes
# when it returns; a sandbox whose client hangs up mid-create is destroyed; a TTL fires
# with the control plane stopped (and denvd restarted meanwhile); a create cut short by
# kill -9 of denvd and a control plane restart leaves nothing behind once both are back.
DATA="$(cat "$STACK_DIR/data-path")"
# shellcheck source=../lib/procs.sh
source "$E2E/lib/procs.sh"
lc() { printf '%s' "$1" | tr 'A-Z' 'a-z'; }
containers_of() { docker ps -aq --filter "label=denv.env=$1" | wc -l | tr -d ' '; }
no_containers() { [ "$(containers_of "$1")" = 0 ]; }
containers_are() { [ "$(containers_of "$1")" = "$2" ]; }
# rules_for <bridge>: the packet-filter rules that name the bridge (nftables and iptables).
rules_for() { { nft list ruleset 2>/dev/null; iptables-save 2>/dev/null; ip6tables-save 2>/dev/null; } | grep -F -- "$1" || true; }
no_rules_for() { [ -z "$(rules_for "$1")" ]; }
destroy_reason() { # the reason of the environment's newest destroy deployment
  denv env deployments "$1" | json_get "[x for x in d['deployments'] if x['Kind']=='destroy'][0]['Params']['reason']"
}
has_event() { grep -q "\"$2\"" <<<"$(denv events "env:$1")"; }

# --- 1. A destroy while the sidecar is down completes when it returns.
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{"image":"busybox:1.36","cmd":["sleep","infinity"],"name":"away"}'
assert_eq "$API_STATUS" 201 "sandbox: $API_BODY"
A=$(printf '%s' "$API_BODY" | json_get "d['environment']['ID']")
exec_out $A main sh -c 'echo data > /work/f' >/dev/null
kill_denvd
wait_for 20 "the host shows as not connected" is_connected False
denv env destroy $A >/dev/null
wait_destroyed $A
D=$(denv env deployments $A | json_get "d['deployments'][0]['ID']")
assert_eq "$(denv deployment get $D | json_get "[p for p in d['phases'] if p['Name']=='teardown'][0]['Evidence']['reason']")" \
  "host not connected; torn down when it reconnects" "deferred teardown"
assert_eq "$(containers_of $A)" 1 "the container waits for its host"
[ -d "$DATA/envs/$A" ] || die "the data of $A vanished before its host returned"
# Destroying it again is not a 409.
api DELETE "/v1/envs/$A"
assert_eq "$API_STATUS" 202 "second destroy: $API_BODY"
start_denvd
wait_for 30 "the host reconnects" is_connected True
wait_for 30 "the containers of $A are removed once its host is back" no_containers $A
wait_for 10 "the data of $A is removed" test ! -e "$DATA/envs/$A"
docker network inspect "$(lc $A)_default" >/dev/null 2>&1 && die "the network of $A is still there"
wait_for 10 "env.torn_down on env:$A" has_event $A env.torn_down

# --- 2. A client that hangs up during POST /v1/sandboxes leaves nothing running.
# denvd is frozen so the create is still in flight when curl gives up after 2 s.
kill -STOP "$(cat "$STACK_DIR/denvd.pid")"
curl -sS -o /dev/null --max-time 2 -X POST "$DENV_SERVER/v1/sandboxes" -H "Authorization: Bearer $DENV_API_KEY" \
  -H 'Content-Type: application/json' -d '{"image":"busybox:1.36","cmd":["sleep","infinity"],"name":"impatient"}' \
  && die "the sandbox call answered within 2 s with denvd frozen"
kill -CONT "$(cat "$STACK_DIR/denvd.pid")"
B=$(env_id sandboxes impatient)
wait_destroyed $B
assert_eq "$(destroy_reason $B)" cancelled "reason of the hung-up sandbox's destroy"
wait_for 20 "nothing of $B runs" no_containers $B
[ -e "$DATA/envs/$B" ] && die "the data of $B is still there"

# --- 3. A TTL fires with the control plane stopped, across a denvd restart.
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{"image":"busybox:1.36","cmd":["sleep","infinity"],"name":"short","ttl_sec":12}'
assert_eq "$API_STATUS" 201 "ttl sandbox: $API_BODY"
T=$(printf '%s' "$API_BODY" | json_get "d['environment']['ID']")
EXP=$(printf '%s' "$API_BODY" | json_get "d['environment']['ExpiresAt']")
[ -n "$EXP" ] || die "no ExpiresAt: $API_BODY"
assert_eq "$(cat "$DATA/envs/$T/expires_at")" "$EXP" "expiry kept by denvd"
kill_cp
kill_denvd
start_denvd   # no control plane to talk to
sleep 2
assert_eq "$(containers_of $T)" 1 "the sandbox before its TTL"
wait_for 40 "the TTL destroys $T without the control plane" no_containers $T
wait_for 10 "the data of $T is removed" test ! -e "$DATA/envs/$T"
start_cp
wait_for 60 "the host reconnects to the new control plane" is_connected True
wait_destroyed $T
assert_eq "$(destroy_reason $T)" ttl "reason of the expired sandbox's destroy"

# --- 4. kill -9 of denvd mid-create, then a control plane restart: nothing is left.
printf 'services:\n  slow:\n    image: busybox:1.36\n    command: ["sh","-c","sleep 30; touch /tmp/ok; sleep 1000000"]\n    healthcheck:\n      test: ["CMD","test","-f","/tmp/ok"]\n      interval: 1s\n      retries: 60\n    volumes: ["w:/w"]\nvolumes: { w: {} }\n' > slow.yaml
denv project create orphans >/dev/null
denv deploy --project orphans -f slow.yaml --wait=false >/dev/null
O=$(env_id orphans alpha)
wait_for 60 "the half-made stack of $O runs" containers_are $O 1
BR=$(docker network inspect -f '{{index .Options "com.docker.network.bridge.name"}}' "$(lc $O)_default")
[ -n "$(rules_for "$BR")" ] || die "no packet-filter rules name the orphan's bridge $BR while it runs"
kill_denvd
kill_cp
# The new control plane would resume the deploy; its host does not come back within
# the resume wait, so it is failed instead.
DENV_RESUME_WAIT=3 start_cp
DEP=$(denv env deployments $O | json_get "[x for x in d['deployments'] if x['Kind']=='deploy'][0]['ID']")
wait_for 30 "the interrupted deploy is failed" dep_is "$DEP" failed
assert_contains "$(denv deployment get $DEP | json_get "d['deployment']['Error']")" "did not reconnect within 3s" "the interrupted deploy"
wait_destroyed $O
assert_eq "$(destroy_reason $O)" abandoned "reason of the abandoned create's destroy"
assert_eq "$(containers_of $O)" 1 "the orphan waits for its host"
start_denvd
wait_for 30 "the host reconnects" is_connected True
wait_for 30 "the orphan's containers are removed" no_containers $O
wait_for 10 "the orphan's data is removed" test ! -e "$DATA/envs/$O"
docker network inspect "$(lc $O)_default" >/dev/null 2>&1 && die "the orphan's network is still there"
wait_for 10 "the orphan's packet-filter rules are removed" no_rules_for "$BR"
wait_for 10 "env.torn_down on env:$O" has_event $O env.torn_down
true
