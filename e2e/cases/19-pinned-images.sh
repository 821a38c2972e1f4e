# A version is its images, not their tags: after a deploy the tag is moved to another
# image; a fork of the version and a from_version sandbox still run the image the deploy
# ran (by id), a new deploy of the same file runs the new one, and once the pinned image
# is gone from the host a fork fails naming the image and its id (it never runs the
# image the tag names now). The same holds for an image verifier: a verify grades with the
# grader the deploy pinned, whatever its tag names later, and fails naming it once gone.
# allow-error: tower_http::trace::on_failure: response failed classification=Status code: 502 Bad Gateway
# A tag of its own (backends run at once, each in a subshell of one runner).
TAG="denv-e2e/pinned:$(od -An -N6 -tx1 /dev/urandom | tr -d " \n")"
build() {
  # The label first: no intermediate image is shared with another run (see 16-builds).
  printf 'FROM busybox:1.36\nLABEL denv.e2e.pin=%s-%s\nRUN echo %s > /which\n' "$TAG" "$1" "$1" |
    docker build -q -t "$TAG" -
}
ONE=$(build one)
printf 'services:\n  app:\n    image: %s\n    command: ["sleep","1000000"]\n' "$TAG" > pin.yaml
denv project create pin >/dev/null
denv deploy --project pin -f pin.yaml >/dev/null
ENV=$(env_id pin alpha)
VER=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
assert_eq "$(denv env versions $ENV | json_get "d['versions'][0]['Spec']['services'][0]['image_id']")" "$ONE" "the version pins the id"
TWO=$(build two)
[ "$ONE" != "$TWO" ] || die "the rebuild gave the same image"

denv fork --name f1 $ENV >/dev/null
F1=$(env_id pin f1)
assert_eq "$(exec_out $F1 app cat /which)" one "a fork after the retag runs the pinned image"
api POST /v1/sandboxes -H 'Content-Type: application/json' -d "{\"from_version\":\"$VER\"}"
assert_eq "$API_STATUS" 201 "from_version sandbox: $API_BODY"
SBX=$(printf '%s' "$API_BODY" | json_get "d['environment']['ID']")
assert_eq "$(exec_out $SBX app cat /which)" one "a from_version sandbox runs the pinned image"
# Control: the same file deployed anew runs what the tag names now.
denv deploy --project pin --env beta -f pin.yaml >/dev/null
BETA=$(env_id pin beta)
assert_eq "$(exec_out $BETA app cat /which)" two "a new deploy resolves the tag again"

# The pinned image leaves the host: the forks go, alpha is redeployed with another image
# (its version VER and that version's snapshot stay), then nothing runs ONE.
for e in $F1 $SBX; do denv env destroy $e >/dev/null; done
for e in $F1 $SBX; do wait_destroyed $e; done
printf 'services:\n  app:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n' > other.yaml
denv deploy --project pin -f other.yaml >/dev/null
docker rmi "$ONE" >/dev/null
api POST /v1/sandboxes -H 'Content-Type: application/json' -d "{\"from_version\":\"$VER\"}"
assert_eq "$API_STATUS" 502 "a fork of a version whose image is gone: $API_BODY"
assert_contains "$API_BODY" "image \\\"$TAG\\\" of service \\\"app\\\" (pinned by the version as $ONE) is no longer on this host" "the failure names the image"
if denv fork --name f2 --version $VER $ENV 2>fork-err >/dev/null; then die "a fork ran without its pinned image"; fi
assert_contains "$(cat fork-err)" "(pinned by the version as $ONE) is no longer on this host" "CLI fork failure"
assert_eq "$(exec_out $BETA app cat /which)" two "the other environment is untouched"

# The grader is pinned too.
VTAG="denv-e2e/grader:$(od -An -N6 -tx1 /dev/urandom | tr -d " \n")"
vbuild() {
  printf 'FROM busybox:1.36\nLABEL denv.e2e.grader=%s-%s\nRUN printf %s > /reward\n' "$VTAG" "$1" "$1" |
    docker build -q -t "$VTAG" -
}
G1=$(vbuild 1)
cat > graded.yaml <<YAML
x-denv:
  agent: {service: box}
  verifier:
    image: $VTAG
    command: ["sh", "-c", "mkdir -p /logs/verifier; cp /reward /logs/verifier/reward.txt"]
    collect: ["/home/agent/answer.txt"]
services:
  box:
    image: busybox:1.36
    user: "1000:1000"
    command: ["sleep", "1000000"]
    volumes: ["home:/home/agent"]
volumes: { home: {} }
YAML
denv deploy --project pin --env graded -f graded.yaml >/dev/null
GENV=$(env_id pin graded)
assert_eq "$(denv env versions $GENV | json_get "d['versions'][0]['Spec']['verifier']['image_id']")" "$G1" "the version pins the grader"
G0=$(vbuild 0)
[ "$G0" != "$G1" ] || die "the grader rebuild gave the same image"
reward() { # reward <env>: the verify's reward, or its error
  local dep
  dep=$(denv verify --resume --wait=false "$1" | json_get "d['deployment']['ID']")
  denv deployment watch "$dep" >/dev/null 2>&1 || true
  denv deployment get "$dep" | json_get "[p['Evidence']['reward'] for p in d['phases'] if p['Name']=='verdict'][0] if d['deployment']['Status']=='succeeded' else d['deployment']['Error']"
}
assert_eq "$(reward $GENV)" 1 "a verify after the grader's retag grades with the pinned grader"
docker rmi "$G1" >/dev/null
assert_contains "$(reward $GENV)" "(pinned by the version as $G1) is no longer on this host" "a verify whose grader is gone fails naming it"

for e in $BETA $ENV $GENV; do denv env destroy $e >/dev/null; done
for e in $BETA $ENV $GENV; do wait_destroyed $e; done
docker rmi "$VTAG" >/dev/null
rm -f graded.yaml
docker rmi "$TAG" >/dev/null
rm -f fork-err
