# The quickstart over https: the stack's control plane started again on its port with
# -tls-cert/-tls-key (a CA made here with openssl), denvd back over https with --ca-file,
# then the quickstart's steps with the CLI and with the Python client. Without the CA
# the CLI, the Python client and denvd fail naming the URL and the TLS problem; plain
# http to the port is told to use https.
# shellcheck source=../lib/procs.sh
source "$E2E/lib/procs.sh"
# shellcheck source=../lib/tls.sh
source "$E2E/lib/tls.sh"
# shellcheck source=../lib/python.sh
source "$E2E/lib/python.sh"

TLS="$STACK_DIR/tls"
tls_make "$TLS"
py_denv_make "$STACK_DIR/py" >/dev/null

# --- The stack on https: the same port, database and host identity.
kill_denvd
kill_cp
PLAIN="$DENV_SERVER"
export DENV_SERVER="https://127.0.0.1:$PORT" CURL_CA_BUNDLE="$TLS/ca.pem"
DENV_TLS_CERT="$TLS/cert.pem" DENV_TLS_KEY="$TLS/key.pem" start_cp
grep -q 'denv-cp listening.*tls=true' "$STACK_DIR/cp.log" || die "denv-cp does not say it serves TLS"
# denvd: the saved server is the plain one; --server and --ca-file given now win and
# are saved with the identity.
(exec denvd run --state "$STACK_DIR/host.json" --server "$DENV_SERVER" --ca-file "$TLS/ca.pem" \
    >>"$STACK_DIR/denvd.log" 2>&1) &
echo $! >"$STACK_DIR/denvd.pid"; disown $!
export DENV_CA_FILE="$TLS/ca.pem"
wait_for 60 "denvd connects over https" is_connected True
assert_eq "$(json_get "d['server'], d['ca_file']" <"$STACK_DIR/host.json")" "$DENV_SERVER $TLS/ca.pem" "host.json"

# --- Without the CA, or with another one: refused, saying why.
X=$(DENV_CA_FILE= denv whoami 2>&1 || true)
assert_contains "$X" "denv: cannot reach $DENV_SERVER: tls: invalid peer certificate: UnknownIssuer" "denv without the CA"
X=$(denv --ca-file "$TLS/other-ca.pem" whoami 2>&1 || true)
assert_contains "$X" "tls: invalid peer certificate: UnknownIssuer" "denv with another CA"
X=$(DENV_SERVER="$PLAIN" denv whoami 2>&1 || true)
assert_contains "$X" "this port speaks TLS: use https://" "denv with http://"
X=$(curl -sS "$PLAIN/health")
assert_eq "$X" '{"error":"this port speaks TLS: use https://"}' "curl with http://"
assert_eq "$(curl -sS "$DENV_SERVER/health" | json_get "d['status']")" ok "curl with the CA"

# --- The quickstart (spec/01-quickstart.md steps 4-8) with the CLI, over https.
denv project create --kind rl-environment quickstart >/dev/null
cat "$E2E/fixtures/quickstart.compose.yaml" > compose.yaml
denv deploy --project quickstart -f compose.yaml --wait
ENV=$(env_id quickstart alpha)
assert_eq "$(denv env get $ENV | json_get "d['environment']['Status']")" healthy "alpha status"
assert_eq "$(exec_out $ENV box sh -c 'id -u; echo 42 > /home/agent/answer.txt')" 1000 "agent uid"
denv exec --service db $ENV -- psql -U postgres -c "create table t(x int); insert into t values (1)" >/dev/null
denv snapshot $ENV
denv fork --name branch-1 $ENV
BRANCH=$(env_id quickstart branch-1)
assert_eq "$(exec_out $BRANCH db psql -U postgres -tAc 'select count(*) from t')" 1 "rows in the fork"
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 1"

# --- The same world through the Python client, over https: the CA as ca_file= and
# from DENV_CA_FILE; without it, DenvError naming the URL and the TLS problem.
py_denv "$STACK_DIR/py" - "$ENV" "$TLS/ca.pem" <<'PY'
import os, sys
import denv
from denv import Client, DenvError

env, ca = sys.argv[1], sys.argv[2]
c = Client(ca_file=ca)
assert c.server.startswith("https://"), c.server
r = c.exec(env, "box", ["cat", "/home/agent/answer.txt"])
assert (r.exit_code, r.stdout.strip()) == (0, "42"), r
c.exec(env, "db", ["psql", "-U", "postgres", "-c", "insert into t values (2)"])
child = c.fork(env)  # snapshot, then a fork carrying the rows
out = c.exec(child.id, "db", ["psql", "-U", "postgres", "-tAc", "select count(*) from t"])
assert out.stdout.strip() == "2", out
v = c.verify(env, resume=True)
assert (v.reward, v.source) == (1.0, "reward.txt"), v
c.destroy(child.id)
print("python over https: exec, fork, verify ok; fork", child.id)

# DENV_CA_FILE is the default.
assert Client().ca_file == ca
assert Client().current_version(env).startswith("ver_")
# Without it: refused, saying why.
os.environ.pop("DENV_CA_FILE")
try:
    Client().current_version(env)
except DenvError as e:
    msg = str(e)
    assert f"cannot reach {os.environ['DENV_SERVER']}: tls: invalid peer certificate: UnknownIssuer" in msg, msg
    assert e.status == 502, e.status
    print("python without the CA:", msg)
else:
    raise SystemExit("the Python client reached the server without trusting its CA")
PY

# --- denvd without the CA: each try is logged with the URL and the TLS problem.
kill_denvd
(exec denvd run --state "$STACK_DIR/host.json" --server "$DENV_SERVER" --ca-file "$TLS/other-ca.pem" \
    >>"$STACK_DIR/denvd.log" 2>&1) &
echo $! >"$STACK_DIR/denvd.pid"; disown $!
wait_for 30 "denvd says why it cannot connect" grep -q "connect $DENV_SERVER: tls: invalid peer certificate: UnknownIssuer" "$STACK_DIR/denvd.log"
kill_denvd
# The saved server (https now) with the right CA again: connected.
FROM=$(( $(stat -c %s "$STACK_DIR/denvd.log") + 1 ))
(exec denvd run --state "$STACK_DIR/host.json" --ca-file "$TLS/ca.pem" >>"$STACK_DIR/denvd.log" 2>&1) &
echo $! >"$STACK_DIR/denvd.pid"; disown $!
reconnected() { tail -c +"$FROM" "$STACK_DIR/denvd.log" | grep -q ' connected '; }
wait_for 60 "denvd reconnects over https" reconnected
wait_for 30 "the host shows as connected" is_connected True

denv env destroy $BRANCH >/dev/null
denv env destroy $ENV >/dev/null
wait_destroyed $BRANCH; wait_destroyed $ENV
assert_eq "$(docker ps -aq --filter label=denv.env=$ENV | wc -l)" 0 "containers left for alpha"
