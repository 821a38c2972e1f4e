# spec/01-quickstart.md steps 4-8 with the CLI exactly as the page shows them.
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
# the fork is isolated: a write there does not reach alpha
exec_out $BRANCH db psql -U postgres -c "insert into t values (2)" >/dev/null
assert_eq "$(exec_out $ENV db psql -U postgres -tAc 'select count(*) from t')" 1 "rows in alpha after writing the fork"
OUT=$(denv verify $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 1"
# without --resume the agent stays frozen
X=$(denv exec --service box $ENV -- true 2>&1 || true)
assert_contains "$X" "paused" "exec into the frozen agent"
denv verify --resume $ENV >/dev/null
denv exec --service box $ENV -- sh -c 'ln -sf /etc/passwd /home/agent/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 0"
assert_contains "$OUT" "source: refused"
assert_contains "$OUT" "home/agent/answer.txt: symlink"
denv env destroy $BRANCH >/dev/null
denv env destroy $ENV >/dev/null
wait_destroyed $BRANCH; wait_destroyed $ENV
assert_eq "$(docker ps -aq --filter label=denv.env=$ENV | wc -l)" 0 "containers left for alpha"
