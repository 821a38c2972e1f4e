# The example of spec/13-ref-compose.md: agent box + redis, image verifier, caps.
denv project create ref >/dev/null
denv deploy --project ref -f "$E2E/fixtures/compose-reference.yaml"
ENV=$(env_id ref alpha)
assert_eq "$(exec_out $ENV db redis-cli ping)" PONG "redis"
# caps from the file and the defaults, on the running containers
assert_eq "$(docker inspect -f '{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}' $(docker ps -q --filter label=denv.env=$ENV --filter label=denv.service=opsbox))" "2147483648 512" "opsbox caps"
# default CPUs: 2.0, but never more than the host's CPUs minus 0.5 (at least 0.5)
CPUS_NANO=$(python3 -c "import os; print(int(max(0.5, min(2.0, len(os.sched_getaffinity(0)) - 0.5)) * 1e9))")
assert_eq "$(docker inspect -f '{{.HostConfig.Memory}} {{.HostConfig.PidsLimit}} {{.HostConfig.NanoCpus}}' $(docker ps -q --filter label=denv.env=$ENV --filter label=denv.service=db))" "4294967296 2048 $CPUS_NANO" "db default caps"
exec_out $ENV opsbox sh -c 'echo hello > /home/agent/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 1"
exec_out $ENV opsbox sh -c 'echo wrong > /home/agent/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 0"
assert_contains "$OUT" "source: reward.txt"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
