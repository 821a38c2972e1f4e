# The environment of spec/30-blog-creating-an-environment.md: Postgres + Redis + agent
# box, a warm command, a service verifier grading against the fork's database.
denv project create blog >/dev/null
denv deploy --project blog -f "$E2E/fixtures/blog.compose.yaml"
ENV=$(env_id blog alpha)
D=$(denv env deployments $ENV | json_get "d['deployments'][0]['ID']")
WARM=$(denv deployment get $D | json_get "[p for p in d['phases'] if p['Name']=='warm'][0]")
assert_contains "$WARM" "'Status': 'ok'" "warm phase"
# the warm command seeded the database before the snapshot
assert_eq "$(exec_out $ENV db psql -U postgres -tAc 'select count(*) from orders')" 3 "seeded orders"
assert_eq "$(exec_out $ENV queue redis-cli ping)" PONG "queue"
exec_out $ENV opsbox sh -c 'echo 3 > /home/ubuntu/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 1"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
