# denv import harbor / karotte and denv export --harbor through the CLI (docs/reference/
# cli.md "import", "export"; docs/howto/harbor.md, docs/howto/karotte.md): Harbor's own
# example-task shape (a Dockerfile-only task, built on the host) and a compose task are
# imported, deployed as alpha and graded by denv verify (0 unsolved, 1 solved with the
# task's own solution/solve.sh run as the agent); the Karotte-shaped fixture is imported
# (steps read without running Python), deployed and judged (0, 1, and 0 for a symlinked
# submission); the imported Harbor task's version is exported as a Harbor task pinned to
# the version's image id, and the Karotte version as one Harbor task per step.
FIX="$E2E/python/fixtures/harbor"
cp -r "$FIX/hello-dockerfile" "$FIX/hello-compose" .
cp -r "$E2E/fixtures/karotte/ops-env" "$FIX/hello-compose-build" .
# A label right after each FROM: no intermediate image is shared with another backend's
# run of this case (they run at once on one engine; see 16-builds).
N=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
for f in hello-dockerfile/environment/Dockerfile hello-compose-build/environment/Dockerfile \
         hello-compose-build/environment/api/Dockerfile ops-env/Dockerfile; do
  awk -v n="$N" '{print} /^FROM / && !done {print "LABEL denv.e2e.run=" n; done=1}' "$f" > "$f.tmp" && mv "$f.tmp" "$f"
done

# built_tags ENV: the denv-build/ images the environment's current version runs.
built_tags() {
  denv env versions "$1" | json_get "' '.join(sorted({s['image'] for s in d['versions'][-1]['Spec']['services'] if s['image'].startswith('denv-build/')}))"
}
verify_reward() { # ENV -> prints the verify output; sets REWARD
  local out; out=$(denv verify --resume "$1"); echo "$out" >&2
  REWARD=$(printf '%s\n' "$out" | sed -n 's/.*reward: \([0-9.]*\).*/\1/p' | head -1)
}

# --- Harbor, Dockerfile-only task -----------------------------------------------------
OUT=$(denv import harbor hello-dockerfile); echo "$OUT"
assert_contains "$OUT" "created project hello-dockerfile (rl-environment)"
assert_contains "$OUT" "deployment "
assert_contains "$(cat hello-dockerfile/docker-compose.yaml)" "egress: deny" "no-network"
ENV=$(env_id hello-dockerfile alpha)
assert_eq "$(exec_out $ENV main id -u)" 1000 "the agent is not root"
assert_eq "$(exec_out $ENV main cat /app/built-by)" dockerfile "built from environment/Dockerfile"
assert_eq "$(exec_out $ENV main sh -c 'test -e /tests || test -e /solution || echo clean')" clean "no tests or solution in the agent's world"
verify_reward $ENV; assert_eq "$REWARD" 0 "unsolved Harbor task"
exec_out $ENV main bash -c "$(cat hello-dockerfile/solution/solve.sh)" >/dev/null
verify_reward $ENV; assert_eq "$REWARD" 1 "solved Harbor task"
OUT=$(denv import harbor --no-deploy hello-dockerfile 2>&1) && die "an existing compose file was replaced: $OUT"
assert_contains "$OUT" "docker-compose.yaml exists; pass --force to replace it"

# --- export --harbor of that version ----------------------------------------------------
VER=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
ID=$(denv env versions $ENV | json_get "[s for s in d['versions'][-1]['Spec']['services'] if s['name']=='main'][0]['image_id']")
case "$ID" in sha256:*) ;; *) die "main's pinned image id: $ID" ;; esac
denv export --harbor --source hello-dockerfile "hello-dockerfile@$VER" dist
T=dist/hello-dockerfile
assert_contains "$(cat $T/task.toml)" "docker_image = \"$ID\"" "pinned image"
assert_contains "$(cat $T/task.toml)" 'network_mode = "no-network"'
assert_eq "$(cat $T/instruction.md)" "$(cat hello-dockerfile/instruction.md)" "instruction"
cmp $T/solution/solve.sh hello-dockerfile/solution/solve.sh
[ -x $T/tests/test.sh ] || die "tests/test.sh is not executable"
# The exported test.sh grades the pinned image the way Harbor's verifier would run it
# (as root, in the task's container): 0 before the solution, 1 after.
grade() { docker run --rm --network none -v "$PWD/$T:/task:ro" "$ID" sh -c "cp -r /task/tests /tests && $1 /tests/test.sh >/dev/null 2>&1; cat /logs/verifier/reward.txt"; }
assert_eq "$(grade '')" 0 "exported test.sh, unsolved"
assert_eq "$(grade 'bash /task/solution/solve.sh &&')" 1 "exported test.sh, solved"
OUT=$(denv export --harbor hello-dockerfile@ver_nope dist2 2>&1) && die "unknown version exported"
assert_contains "$OUT" "version ver_nope is not a version of an environment of project hello-dockerfile"
TAGS1=$(built_tags $ENV)
denv env destroy $ENV >/dev/null; wait_destroyed $ENV

# --- Harbor, compose task (main + redis) ------------------------------------------------
denv import harbor hello-compose
ENV=$(env_id hello-compose alpha)
verify_reward $ENV; assert_eq "$REWARD" 0 "unsolved compose task"
exec_out $ENV main bash -c "$(cat hello-compose/solution/solve.sh)" >/dev/null
verify_reward $ENV; assert_eq "$REWARD" 1 "solved compose task (redis reached by name)"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV

# --- Harbor, compose task with build: (main and api built on the host), written
# elsewhere with --out: absolute build contexts, Harbor's variables interpolated, and
# main's environment in the grader's (its test.sh reads $MAIN_IMAGE).
mkdir cb-out
denv import harbor --out cb-out --project cb hello-compose-build
[ -e hello-compose-build/docker-compose.yaml ] && die "--out wrote into the task"
assert_contains "$(cat cb-out/docker-compose.yaml)" "context: $PWD/hello-compose-build/environment/api"
ENV=$(env_id cb alpha)
assert_eq "$(exec_out $ENV main sh -c 'echo $MAIN_IMAGE')" hb__hello-compose-build "\${MAIN_IMAGE_NAME}"
verify_reward $ENV; assert_eq "$REWARD" 0 "unsolved compose-build task"
exec_out $ENV main bash -c "$(cat hello-compose-build/solution/solve.sh)" >/dev/null
verify_reward $ENV; assert_eq "$REWARD" 1 "solved compose-build task (built api reached, env in the grader)"
TAGS3=$(built_tags $ENV)
denv env destroy $ENV >/dev/null; wait_destroyed $ENV

# --- Karotte ----------------------------------------------------------------------------
OUT=$(denv import karotte ops-env); echo "$OUT"
assert_contains "$OUT" "created project ops-env (rl-environment)"
assert_eq "$(cat ops-env/tasks/sum_numbers/instruction.md | head -c 25)" "/home/student/numbers.txt" "a step became a task"
assert_contains "$(cat ops-env/tasks/sum_numbers/verifier.yaml)" "- sum_numbers"
ENV=$(env_id ops-env alpha)
assert_eq "$(exec_out $ENV karotte id -u)" 1000 "the student"
verify_reward $ENV; assert_eq "$REWARD" 0 "no submission"
exec_out $ENV karotte sh -c 'mkdir -p /home/student/submission && echo "Hello, Karotte!" > /home/student/submission/answer.txt' >/dev/null
verify_reward $ENV; assert_eq "$REWARD" 1 "judged by karotte judge --step write_greeting"
exec_out $ENV karotte sh -c 'rm /home/student/submission/answer.txt && ln -s /etc/hostname /home/student/submission/answer.txt' >/dev/null
OUT=$(denv verify --resume $ENV); echo "$OUT"
assert_contains "$OUT" "reward: 0"
assert_contains "$OUT" "source: refused"
# Its version as Harbor tasks (one per step): the step's judge through the exported
# test.sh, with the submission collected as denv verify collects it.
KVER=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
KID=$(denv env versions $ENV | json_get "[s for s in d['versions'][-1]['Spec']['services'] if s['name']=='karotte'][0]['image_id']")
denv export --harbor --source ops-env "ops-env@$KVER" kdist
assert_eq "$(ls kdist | tr '\n' ' ')" "sum_numbers write_greeting " "a Harbor task per step"
assert_contains "$(cat kdist/write_greeting/task.toml)" "docker_image = \"$KID\""
kgrade() { # TASK SETUP -> the reward of the exported test.sh, run as root in the image
  docker run --rm --network none -u 0 -v "$PWD/kdist/$1:/task:ro" "$KID" sh -c "$2; cp -r /task/tests /tests && sh /tests/test.sh >/dev/null 2>&1; cat /logs/verifier/reward.txt"
}
assert_eq "$(kgrade write_greeting true)" 0.0 "exported karotte task, no submission"
assert_eq "$(kgrade write_greeting 'mkdir -p /home/student/submission && echo "Hello, Karotte!" > /home/student/submission/answer.txt')" 1.0 "exported karotte task, solved"
assert_eq "$(kgrade sum_numbers 'mkdir -p /home/student/submission && echo 12 > /home/student/submission/sum.txt')" 1.0 "the second step's own judge"
assert_eq "$(kgrade write_greeting 'mkdir -p /home/student/submission && ln -s /etc/hostname /home/student/submission/answer.txt')" 0 "a symlink is refused"
TAGS2=$(built_tags $ENV)
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
# shellcheck disable=SC2086
docker rmi -f $TAGS1 $TAGS2 $TAGS3 >/dev/null
