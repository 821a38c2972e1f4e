# Egress that means what it says. A denied environment reaches its own services and
# nothing else: not a listener on any address of the host, not another environment, not
# the metadata address; outside names are refused at once. It still publishes its ports.
# An allowed environment publishes too and does not reach the host either. The deploy's
# evidence lists every attempt of the probe. No packet leaves the machine: every target
# is an address of this host or one the policy rejects locally.

# A listener on every address of the host (stands in for a control plane on 0.0.0.0).
HOSTPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
python3 -m http.server "$HOSTPORT" --bind 0.0.0.0 >/dev/null 2>&1 &
HOSTSRV=$!
trap 'kill $HOSTSRV 2>/dev/null || true' EXIT
for _ in $(seq 1 50); do curl -fsS -o /dev/null "http://127.0.0.1:$HOSTPORT/" && break; sleep 0.1; done
HOSTIPS=$(ip -o -4 addr show | awk '{print $4}' | cut -d/ -f1 | grep -v '^127\.' | tr '\n' ' ')

# ms_of <cmd...>: wall time of a command in milliseconds (its status is ignored).
ms_of() { local t0; t0=$(date +%s%N); "$@" >/dev/null 2>&1 || true; echo $(( ($(date +%s%N) - t0) / 1000000 )); }

denv project create egress >/dev/null
printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n  web:\n    image: busybox:1.36\n    command: ["sh","-c","echo hello-denied > /tmp/index.html; exec httpd -f -p 8000 -h /tmp"]\n    ports: ["8000"]\n' > deny.yaml
OUT=$(denv deploy --project egress -f deny.yaml); echo "$OUT"
assert_contains "$OUT" "denied (verified)" "deploy output"
ENV=$(env_id egress alpha)

# Published under deny, reported, served.
EP=$(denv env get $ENV | json_get "d['environment']['Endpoints']['web']")
assert_contains "$EP" "127.0.0.1:" "endpoint under deny"
assert_eq "$(curl -fsS "http://$EP/")" hello-denied "page served by a denied environment"

# Its own services by name.
assert_eq "$(exec_out $ENV box wget -q -T 3 -O- http://web:8000/)" hello-denied "own service by name"

# The host on every address, the metadata address and the public address: refused at
# once (a dropped packet would wait out the 3 s timeout of each attempt).
SCRIPT="for a in $HOSTIPS 169.254.169.254 1.1.1.1; do p=$HOSTPORT; case \$a in 169.*|1.1.1.1) p=80;; esac; if wget -q -T 3 -O /dev/null http://\$a:\$p/ 2>/dev/null; then echo REACHED \$a; fi; done; echo done"
T0=$(date +%s%N)
R=$(exec_out $ENV box sh -c "$SCRIPT")
MS=$(( ($(date +%s%N) - T0) / 1000000 ))
assert_eq "$R" done "nothing reached from the denied box ($HOSTIPS)"
[ "$MS" -lt 2500 ] || die "the host's addresses took $MS ms to refuse: something waited for a timeout"

# Outside names: refused at once; no query leaves (denvd's refuser answers on the gateway).
X=$(denv exec --service box $ENV -- nslookup denv-e2e-egress.example.com 2>&1 || true)
assert_contains "$X" "REFUSED" "outside lookup from the denied box"
MS=$(ms_of denv exec --service box $ENV -- nslookup denv-e2e-egress.example.com)
[ "$MS" -lt 2500 ] || die "the outside lookup took $MS ms"

# The evidence: every attempt of the probe, all stopped, in milliseconds.
DEP=$(denv env deployments $ENV | json_get "d['deployments'][0]['ID']")
api GET "/v1/deployments/$DEP"
PROBE=$(printf '%s' "$API_BODY" | json_get "json.dumps([p for p in d['phases'] if p['Name']=='prepare'][0]['Evidence']['egress_probe'])")
printf '%s' "$PROBE" | json_get "[a['target'] for a in d['attempts']]"
assert_eq "$(printf '%s' "$PROBE" | json_get "all(a['result'].split(' ')[0] in ('refused','rejected','unreachable') for a in d['attempts'])")" True "every attempt stopped: $PROBE"
assert_eq "$(printf '%s' "$PROBE" | json_get "sorted({a['target'] for a in d['attempts'] if not a['target'].startswith('host')})")" "['canary', 'metadata', 'public']" "targets"
assert_eq "$(printf '%s' "$PROBE" | json_get "d['took_us'] < 50000")" True "probe time: $PROBE"

# Allowed: publishes, and reaches neither the host nor the denied environment.
printf 'x-denv: { egress: allow }\nservices:\n  web:\n    image: busybox:1.36\n    command: ["sh","-c","echo hello > /tmp/index.html; exec httpd -f -p 8000 -h /tmp"]\n    ports: ["8000"]\n' > allow.yaml
denv project create egress-allow >/dev/null
denv deploy --project egress-allow -f allow.yaml
ENV2=$(env_id egress-allow alpha)
EP=$(denv env get $ENV2 | json_get "d['environment']['Endpoints']['web']")
assert_contains "$EP" "127.0.0.1:" "endpoint"
assert_eq "$(curl -fsS "http://$EP/")" hello "page served through the published endpoint"
DENIED_WEB=$(docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$(printf '%s' "$ENV" | tr 'A-Z' 'a-z')-web-1")
SCRIPT="for a in $HOSTIPS; do if wget -q -T 3 -O /dev/null http://\$a:$HOSTPORT/ 2>/dev/null; then echo REACHED \$a; fi; done; if wget -q -T 3 -O /dev/null http://$DENIED_WEB:8000/ 2>/dev/null; then echo REACHED other env; fi; echo done"
T0=$(date +%s%N)
R=$(exec_out $ENV2 web sh -c "$SCRIPT")
MS=$(( ($(date +%s%N) - T0) / 1000000 ))
assert_eq "$R" done "nothing of the host or the other environment reached from the allowed box"
[ "$MS" -lt 2500 ] || die "refusals from the allowed box took $MS ms"

denv env destroy $ENV >/dev/null; denv env destroy $ENV2 >/dev/null
wait_destroyed $ENV; wait_destroyed $ENV2
