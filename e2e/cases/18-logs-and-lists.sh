# denv logs, denv env list and denv project delete through the real stack: a service's
# stdout/stderr read back as the engine keeps it, every line prefixed by the control
# plane (the agent cannot print lines that pass for another service's), --follow picks
# up a line written after it started and stops the host's reading when it is
# interrupted, environments listed across projects with filters, a project delete
# refused while it has live environments and forced through their destroys.
cat > compose.yaml <<'EOF'
x-denv:
  agent: { service: agent }
services:
  web:
    image: busybox:1.36
    command: ["sh", "-c", "echo web-started; echo web-warn >&2; exec sleep infinity"]
  agent:
    image: busybox:1.36
    user: "1000:1000"
    command: ["sleep", "infinity"]
EOF
denv project create logs-world >/dev/null
denv project create other-world >/dev/null
denv deploy --project logs-world -f compose.yaml >/dev/null
ENV=$(env_id logs-world alpha)
OTHER=$(env_id other-world alpha)
ERR="$PWD/logs-err"

# One service: its stdout to stdout, its stderr to stderr, as written.
OUT=$(denv logs --service web $ENV 2>$ERR)
assert_eq "$OUT" web-started "web stdout"
assert_eq "$(cat $ERR)" web-warn "web stderr"

# Something written to a service's stdout after start (PID 1's stdout is the log).
denv exec --service web $ENV -- sh -c 'echo written-later > /proc/1/fd/1' >/dev/null
assert_eq "$(denv logs --service web --tail 1 $ENV)" written-later "--tail 1"

# Every service: prefixed by the control plane, names padded. The agent prints a line
# that looks like web's, with a carriage return to hide its own prefix: it stays the
# agent's, and the control character is shown escaped.
denv exec --service agent $ENV -- sh -c 'printf "\rweb   | forged\n" > /proc/1/fd/1' >/dev/null
ALL=$(denv logs $ENV)
echo "$ALL"
assert_contains "$ALL" "web   | web-started" "prefixed web line"
assert_contains "$ALL" "web   | web-warn" "prefixed web stderr line"
assert_contains "$ALL" 'agent | \x0dweb   | forged' "the forged line is the agent's"
if grep -q '^web   | forged' <<<"$ALL"; then die "the agent passed a line off as web's: $ALL"; fi
[ "$(printf '%s\n' "$ALL" | grep -c .)" -eq 4 ] || die "want 4 lines: $ALL"

# Timestamps: the engine's RFC 3339 time first.
TS=$(denv logs --service web --tail 1 --timestamps $ENV)
printf '%s' "$TS" | grep -Eq '^20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z written-later$' || die "timestamped line: $TS"

# REST: JSON lines with the service set.
api GET "/v1/envs/$ENV/logs?service=web&tail=5"
assert_eq "$API_STATUS" 200 "logs over REST: $API_BODY"
# (stdout and stderr are two pipes: their relative order is the engine's, so sorted)
assert_eq "$(printf '%s\n' "$API_BODY" | python3 -c 'import json,sys; print(",".join(sorted(json.loads(l)["service"]+":"+json.loads(l)["stream"]+":"+json.loads(l)["line"] for l in sys.stdin if l.strip())))')" \
  "web:stderr:web-warn,web:stdout:web-started,web:stdout:written-later" "REST lines"
api GET "/v1/envs/$ENV/logs?service=nope"
assert_eq "$API_STATUS" 400 "unknown service"
assert_contains "$API_BODY" "the services of $ENV are agent, web" "names the services"

# Refusals exit 1 with the reason.
if denv logs --service nope $ENV 2>$ERR; then die "unknown service accepted"; fi
assert_contains "$(cat $ERR)" 'unknown service "nope"' "CLI refusal"

# --follow: a line written after it started arrives; interrupting it ends the host's
# reading (the sidecar logs the cancel).
FOLLOW="$PWD/logs-follow"
denv logs --follow --tail 0 --service web $ENV >$FOLLOW 2>&1 &
FPID=$!
sleep 2
[ ! -s $FOLLOW ] || die "--tail 0 printed a backlog: $(cat $FOLLOW)"
denv exec --service web $ENV -- sh -c 'echo after-follow > /proc/1/fd/1' >/dev/null
for _ in $(seq 1 60); do grep -q after-follow $FOLLOW && break; sleep 0.25; done
assert_eq "$(cat $FOLLOW)" after-follow "followed line"
kill -0 $FPID || die "--follow ended by itself"
CANCELS_BEFORE=$(grep -c 'command cancelled by the control plane' "$STACK_DIR/denvd.log" || true)
kill -TERM $FPID; wait $FPID || true  # (background jobs of a non-interactive shell ignore SIGINT)
for _ in $(seq 1 40); do
  [ "$(grep -c 'command cancelled by the control plane' "$STACK_DIR/denvd.log" || true)" -gt "$CANCELS_BEFORE" ] && break
  sleep 0.25
done
[ "$(grep -c 'command cancelled by the control plane' "$STACK_DIR/denvd.log" || true)" -gt "$CANCELS_BEFORE" ] || die "the host never got the cancel"
rm -f $FOLLOW

# env list: across projects, with filters.
LIST=$(denv env list)
echo "$LIST"
assert_eq "$(printf '%s\n' "$LIST" | head -1 | tr -s ' ')" "ID NAME PROJECT STATUS VERSION" "header"
printf '%s\n' "$LIST" | grep -Eq "^$ENV +alpha +logs-world +healthy +ver_" || die "logs-world row: $LIST"
printf '%s\n' "$LIST" | grep -Eq "^$OTHER +alpha +other-world +pending +-$" || die "other-world row: $LIST"
assert_eq "$(denv env list --status healthy -q)" "$ENV" "--status healthy"
assert_eq "$(denv env list --project other-world -q)" "$OTHER" "--project"
assert_eq "$(denv env list --json --project logs-world | json_get "d['environments'][0]['Project']")" logs-world "--json"
if denv env list --status running 2>$ERR; then die "unknown status accepted"; fi
assert_eq "$(cat $ERR)" 'denv: unknown status "running": use one of pending, deploying, healthy, failed, destroying, destroyed' "status refusal"

# project delete: refused while live (exit 1, naming them), then forced.
if denv project delete logs-world 2>$ERR; then die "deleting a project with a live env succeeded"; fi
assert_contains "$(cat $ERR)" "not destroyed: alpha ($ENV, healthy)" "refusal names the env"
assert_eq "$(docker ps -q --filter label=denv.env=$ENV | wc -l | tr -d ' ')" 2 "nothing touched"
D=$(denv project delete --force logs-world)
assert_eq "$(printf '%s' "$D" | json_get "d['deleted'], d['destroyed'][0]['Status'], d['destroyed'][0]['EnvID']")" "True succeeded $ENV" "forced delete"
assert_eq "$(docker ps -aq --filter label=denv.env=$ENV | wc -l | tr -d ' ')" 0 "containers of the deleted project"
assert_eq "$(denv project list | json_get "[p['Name'] for p in d['projects']]")" "['other-world']" "projects left"
assert_eq "$(denv env list -a -q)" "$OTHER" "envs left"
# A never-deployed project: its pending alpha counts as live, --force removes it.
if denv project delete other-world 2>$ERR; then die "pending alpha not refused"; fi
denv project delete --force other-world >/dev/null
assert_eq "$(denv env list -a -q)" "" "no envs left"
rm -f $ERR
