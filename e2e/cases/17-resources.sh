# Caps per sandbox and per fork (docs/reference/rest-api.md "Resources"), as an attacker
# inside the environment sees them: a 64 MiB sandbox cannot allocate 200 MiB, 0.5 CPU
# is the container's CFS quota and NanoCpus, 64 pids stop a fork bomb, and on btrfs/zfs
# a write past a 64 MiB disk quota is refused. A fork asking for other caps gets them
# (the parent keeps its own); bad values and values above the host are 400 naming the
# key, and nothing is created for them.
# exec_raw <env> <cmd...>: the exec's JSON whatever the exit code.
exec_raw() { local env="$1"; shift; denv exec --service main "$env" -- "$@"; }
cid() { docker ps -q --filter "label=denv.env=$1" --filter "label=denv.service=main"; }
# cgroup_limits <env>: "<cpu quota> <cpu period> <memory bytes> <pids>" inside the container (v1 or v2)
cgroup_limits() {
  exec_out "$1" main sh -c 'if [ -f /sys/fs/cgroup/cpu.max ]; then echo $(cat /sys/fs/cgroup/cpu.max /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max); else echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max); fi'
}
HOG="b = b'x' * (200 << 20); print('survived', len(b))"

# ---- refused: bad values and values above the host, each naming the key; nothing made.
for bad in '{"cpus":0}' '{"cpus":-1}' '{"memory":"64 bananas"}' '{"memory":"0"}' '{"pids":-5}' '{"disk":"1k"}' '{"memroy":"64m"}' '{"cpus":1000}' '{"cpus":64}' '{"memory":"1000000m"}'; do
  api POST /v1/sandboxes -H 'Content-Type: application/json' -d "{\"image\":\"python:3.12-slim\",\"cmd\":[\"sleep\",\"infinity\"],\"resources\":$bad}"
  assert_eq "$API_STATUS" 400 "sandbox with resources $bad: $API_BODY"
  key=$(printf '%s' "$bad" | json_get "list(d)[0]")
  assert_contains "$API_BODY" "resources.$key" "refusal of $bad"
done
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{"image":"python:3.12-slim","resources":{"cpus":64}}'
assert_contains "$API_BODY" "is more than host" "cpus above the host"
assert_eq "$(denv project list | json_get "len([p for p in d['projects'] if p['Name']=='sandboxes'])")" 0 "a project made by a refused request"

# ---- a 64 MiB, 0.5 CPU, 64 pids sandbox (and a 64 MiB disk where the storage enforces one).
RES='{"cpus":0.5,"memory":"64m","pids":64}'
[ "$STACK_STORAGE" != dir ] && RES='{"cpus":0.5,"memory":"64m","pids":64,"disk":"64m"}'
api POST /v1/sandboxes -H 'Content-Type: application/json' -d "{\"image\":\"python:3.12-slim\",\"cmd\":[\"sleep\",\"infinity\"],\"resources\":$RES}"
assert_eq "$API_STATUS" 201 "capped sandbox: $API_BODY"
SBX=$(printf '%s' "$API_BODY" | json_get "d['environment']['ID']")
DEP=$(printf '%s' "$API_BODY" | json_get "d['deployment']['ID']")
EV=$(denv deployment get "$DEP" | json_get "json.dumps([p for p in d['phases'] if p['Name']=='prepare'][0]['Evidence']['resources'], sort_keys=True)")
assert_contains "$EV" '"main": {"cpus": 0.5, "memory_mb": 64, "pids": 64}' "prepare evidence"
assert_eq "$(docker inspect -f '{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}' "$(cid $SBX)")" "500000000 67108864 64" "docker inspect of the capped sandbox"
assert_eq "$(cgroup_limits $SBX)" "50000 100000 67108864 64" "cgroup limits inside the sandbox"
# 200 MiB: killed.
J=$(exec_raw $SBX python3 -c "$HOG")
assert_eq "$(printf '%s' "$J" | json_get "d['exit_code']")" 137 "200 MiB in a 64 MiB sandbox: $J"
if [ "$STACK_STORAGE" != dir ]; then
  assert_contains "$EV" "\"disk_mb\": 64" "disk in the evidence"
  J=$(exec_raw $SBX sh -c 'dd if=/dev/urandom of=/work/big bs=1M count=200 conv=fsync; echo rc=$?')
  assert_contains "$(printf '%s' "$J" | json_get "d['stderr']")" "Disk quota exceeded" "write past a 64 MiB quota on $STACK_STORAGE"
  exec_out $SBX main rm -f /work/big >/dev/null
else
  assert_contains "$EV" '"disk_quota": "none"' "dir storage enforces no disk quota, and says so"
fi

# ---- a fork with caps of its own: 512 MiB, 1 CPU; the parent keeps 64 MiB.
denv snapshot $SBX >/dev/null
OUT=$(denv fork --name big --memory 512m --cpus 1 $SBX)
CHILD=$(env_id sandboxes big)
assert_eq "$(docker inspect -f '{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}} {{.HostConfig.PidsLimit}}' "$(cid $CHILD)")" "1000000000 536870912 64" "docker inspect of the fork"
assert_eq "$(exec_out $CHILD main python3 -c "$HOG")" "survived $((200 << 20))" "200 MiB in the 512 MiB fork"
assert_eq "$(printf '%s' "$(exec_raw $SBX python3 -c "$HOG")" | json_get "d['exit_code']")" 137 "the parent still at 64 MiB"
FDEP=$(denv env deployments $CHILD | json_get "[x for x in d['deployments'] if x['Kind']=='fork'][0]['ID']")
FEV=$(denv deployment get "$FDEP" | json_get "json.dumps([p for p in d['phases'] if p['Name']=='clone'][0]['Evidence']['resources'], sort_keys=True)")
assert_contains "$FEV" '"requested": {"cpus": 1, "memory_mb": 512}' "clone evidence: requested"
assert_contains "$FEV" '"main": {"cpus": 1, "memory_mb": 512, "pids": 64}' "clone evidence: effective"
# A fork asking for more than the host is refused before anything is made.
if denv fork --name toobig --cpus 4096 $SBX 2>/tmp/denv-e2e-res.err; then die "a fork with 4096 CPUs was accepted"; fi
assert_contains "$(cat /tmp/denv-e2e-res.err)" "resources.cpus" "CLI refusal"
rm -f /tmp/denv-e2e-res.err

# Fork bomb, last (its orphans stay as zombies of PID 1, which uses the pids up): stopped
# at the sandbox's 64 pids; the sandbox's container stays up, the fork is untouched.
J=$(exec_raw $SBX sh -c 'for i in $(seq 200); do sleep 3 & done; echo done')
assert_contains "$(printf '%s' "$J" | json_get "d['stderr']")" "fork" "fork bomb in a 64-pid sandbox"
assert_eq "$(docker inspect -f '{{.State.Running}}' "$(cid $SBX)")" true "the sandbox after its fork bomb"
assert_eq "$(exec_out $CHILD main echo alive)" alive "the fork after the parent's fork bomb"

denv env destroy $CHILD >/dev/null; denv env destroy $SBX >/dev/null
wait_destroyed $CHILD; wait_destroyed $SBX
