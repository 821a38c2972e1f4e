# The warm pool on a real engine (docs/reference/deployments.md "Warm pool"): a deploy
# with x-denv.pool fills members; a fork (CLI) and a from_version sandbox (REST) are handed
# out already succeeded, each isolated (own data, own network, egress still denied); the
# pool refills; a new deploy drains the old version's members; destroying the owner drains
# the rest, and nothing is left on the machine.
containers_of() { docker ps -aq --filter "label=denv.env=$1" | wc -l | tr -d ' '; }
nets_of() { # the networks of the environment's containers, one per line
  for c in $(docker ps -q --filter "label=denv.env=$1"); do
    docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{"\n"}}{{end}}' "$c"
  done | sed '/^$/d' | sort -u
}
# members <version>: ids of the healthy pool members of that version, one per line
members() {
  denv project envs pool | json_get "'\n'.join(e['ID'] for e in d['environments'] if e['Stage']=='pool' and e['Status']=='healthy' and e['ParentVersionID']=='$1')"
}
live_members() {
  denv project envs pool | json_get "len([e for e in d['environments'] if e['Stage']=='pool' and e['Status'] not in ('destroyed',)])"
}
wait_members() { # wait_members <version> <n>
  for _ in $(seq 1 300); do
    [ "$(members "$1" | sed '/^$/d' | wc -l)" = "$2" ] && [ "$(live_members)" = "$2" ] && return 0
    sleep 0.5
  done
  denv project envs pool >&2
  die "pool of $1 did not reach $2 healthy members"
}
destroy_reason() {
  denv env deployments "$1" | json_get "[x for x in d['deployments'] if x['Kind']=='destroy'][0]['Params']['reason']"
}
newest_dep() { denv env deployments "$1" | json_get "d['deployments'][0]['$2'] if '$2' != 'pool' else d['deployments'][0]['Params'].get('pool', '')"; }

denv project create pool >/dev/null
cat > c.yaml <<'EOF'
x-denv:
  pool: 2
services:
  box:
    image: busybox:1.36
    user: "1000:1000"
    command: ["sh", "-c", "exec sleep 1000000"]
    volumes: ["w:/work"]
volumes: { w: {} }
EOF
denv deploy --project pool -f c.yaml >/dev/null
ENV=$(env_id pool alpha)
V1=$(denv env get "$ENV" | json_get "d['environment']['CurrentVersionID']")
wait_members "$V1" 2
FIRST=$(members "$V1" | tr '\n' ' ')
# Written after the version's snapshot: no fork of it may see this.
exec_out "$ENV" box sh -c 'echo parent > /work/late' >/dev/null

# --- a fork through the CLI is a hand-out.
denv fork --name w1 "$ENV" >/dev/null
W1=$(env_id pool w1)
assert_contains "$FIRST" "$W1" "w1 is one of the members"
assert_eq "$(newest_dep "$W1" pool)" hit "w1's fork deployment"
assert_eq "$(newest_dep "$W1" Status)" succeeded "w1's fork deployment"
assert_eq "$(denv env get "$W1" | json_get "d['environment']['Stage']")" fork "w1's stage"

# --- a from_version sandbox over REST is a hand-out too, answered final; pool: 3 from now.
api POST /v1/sandboxes -H 'Content-Type: application/json' -d "{\"from_version\":\"$V1\",\"name\":\"s1\",\"pool\":3,\"ttl_sec\":3600}"
assert_eq "$API_STATUS" 201 "sandbox: $API_BODY"
S1=$(printf '%s' "$API_BODY" | json_get "d['environment']['ID']")
assert_eq "$(printf '%s' "$API_BODY" | json_get "d['deployment']['Params']['pool']")" hit "s1's deployment"
assert_contains "$FIRST" "$S1" "s1 is one of the members"
[ "$(printf '%s' "$API_BODY" | json_get "d['environment']['ExpiresAt']")" != "" ] || die "s1 has no TTL"

# --- each hand-out is its own world.
assert_eq "$(exec_out "$W1" box ls /work)" "" "w1 sees the parent's later write"
exec_out "$W1" box sh -c 'echo w1 > /work/mine' >/dev/null
j=$(denv exec --service box "$S1" -- cat /work/mine)
[ "$(printf '%s' "$j" | json_get "d['exit_code']")" != 0 ] || die "s1 sees w1's write: $j"
j=$(denv exec --service box "$ENV" -- cat /work/mine)
[ "$(printf '%s' "$j" | json_get "d['exit_code']")" != 0 ] || die "the parent sees w1's write: $j"
for n in $(nets_of "$W1"); do
  grep -qxF "$n" <<<"$(nets_of "$S1")" && die "w1 and s1 share network $n"
  grep -qxF "$n" <<<"$(nets_of "$ENV")" && die "w1 and the parent share network $n"
done
[ -n "$(nets_of "$W1")" ] || die "w1 has no network"
j=$(denv exec --service box "$W1" -- wget -q -T 2 -O /dev/null http://1.1.1.1/)
[ "$(printf '%s' "$j" | json_get "d['exit_code']")" != 0 ] || die "w1 reached the internet: $j"

# --- refill up to the new size, with new members.
wait_members "$V1" 3
OLD=$(members "$V1" | tr '\n' ' ')
for m in $OLD; do case " $FIRST " in *" $m "*) die "member $m was handed out and is still listed";; esac; done

# --- a new deploy: the old version's members are drained, the new version's filled.
sed -i 's/exec sleep/echo two > \/tmp\/tag; exec sleep/' c.yaml
denv deploy --project pool -f c.yaml >/dev/null
V2=$(denv env get "$ENV" | json_get "d['environment']['CurrentVersionID']")
[ "$V2" != "$V1" ] || die "no new version"
wait_members "$V2" 3
for m in $OLD; do
  wait_destroyed "$m"
  assert_eq "$(destroy_reason "$m")" drained "$m's destroy reason"
  assert_eq "$(containers_of "$m")" 0 "containers of drained $m"
done
denv fork --name w2 "$ENV" >/dev/null
W2=$(env_id pool w2)
assert_eq "$(newest_dep "$W2" pool)" hit "w2's fork deployment"
assert_eq "$(exec_out "$W2" box cat /tmp/tag)" two "w2 runs the new version"
wait_members "$V2" 3

# --- destroying the owner drains its pool; then everything goes.
LAST=$(members "$V2" | tr '\n' ' ')
denv env destroy "$ENV" >/dev/null
for m in $LAST; do
  wait_destroyed "$m"
  assert_eq "$(destroy_reason "$m")" drained "$m's destroy reason"
done
for e in "$W1" "$S1" "$W2"; do denv env destroy "$e" >/dev/null; done
for e in "$ENV" "$W1" "$S1" "$W2"; do wait_destroyed "$e"; done
assert_eq "$(live_members)" 0 "live pool members"
