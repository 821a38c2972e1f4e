# Images built on the host (compose build:, docs/reference/compose.md "Builds") through
# the CLI: the built image serves with its args; the version pins denv-build/<key> and
# prepare's evidence the build; a second deploy of the same files is a cache hit; a
# failing Dockerfile fails prepare with its output; an oversize context is refused
# before anything is sent.
denv project create bld >/dev/null
N=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
mkdir -p app bad big
# The label first: no intermediate image is shared with another backend's run of this
# case (they run at once on one engine, and a `docker rmi` of one run's image removes its
# untagged parents while the other builds on them).
printf 'FROM busybox:1.36\nLABEL denv.e2e.run=%s\nARG WORD=unset\nCOPY hello.txt /hello.txt\nRUN echo "$WORD" > /word\nUSER 1000:1000\n' "$N" > app/Dockerfile
printf 'hello %s\n' "$N" > app/hello.txt
cat > c.yaml <<EOF
services:
  app:
    build: { context: ./app, args: { WORD: built } }
    command: ["sleep", "1000000"]
EOF
denv deploy --project bld -f c.yaml
ENV=$(env_id bld alpha)
assert_eq "$(exec_out $ENV app cat /hello.txt)" "hello $N" "file copied by the build"
assert_eq "$(exec_out $ENV app cat /word)" built "build arg"
assert_eq "$(exec_out $ENV app id -u)" 1000 "the image's USER"

# prepare of the latest deployment: builds.app
prepare() {
  denv env deployments "$ENV" | python3 -c '
import json, sys
deps = [d for d in json.load(sys.stdin)["deployments"] if d["Kind"] == "deploy"]
deps.sort(key=lambda d: d["CreatedAt"])
print(deps[-1]["ID"])' | xargs -I{} denv deployment get {} |
    json_get "json.dumps([p for p in d['phases'] if p['Name']=='prepare'][0])"
}
P1=$(prepare)
TAG=$(printf '%s' "$P1" | json_get "d['Evidence']['builds']['app']['tag']")
case "$TAG" in denv-build/*) ;; *) die "tag $TAG" ;; esac
assert_eq "$(printf '%s' "$P1" | json_get "d['Evidence']['builds']['app']['cached']")" False "first build"
ID=$(printf '%s' "$P1" | json_get "d['Evidence']['builds']['app']['image_id']")
assert_eq "$(printf '%s' "$P1" | json_get "d['Evidence']['digests']['app']")" "$ID" "pinned digest is the built image"
assert_eq "$(denv env versions $ENV | json_get "d['versions'][-1]['Spec']['services'][0]['image']")" "$TAG" "version spec image"
CMD=$(printf '%s' "$P1" | json_get "d['Evidence']['builds']['app']['command']")
api GET "/v1/events?subject=cmd:$CMD"
assert_contains "$API_BODY" "build app: Step 1/" "build output as progress lines"

# The same files again: reused, not rebuilt.
touch app/hello.txt
denv deploy --project bld -f c.yaml
P2=$(prepare)
assert_eq "$(printf '%s' "$P2" | json_get "d['Evidence']['builds']['app']['cached']")" True "second build"
assert_eq "$(printf '%s' "$P2" | json_get "d['Evidence']['builds']['app']['tag']")" "$TAG" "same tag"

# A failing Dockerfile fails prepare with its own output.
printf 'FROM busybox:1.36\nRUN echo boom-%s && exit 7\n' "$N" > bad/Dockerfile
printf 'services:\n  app:\n    build: ./bad\n' > bad.yaml
OUT=$(denv deploy --project bld --env beta -f bad.yaml 2>&1) && die "failing build deployed: $OUT"
assert_contains "$OUT" 'build of service "app" failed'
BETA=$(env_id bld beta)
TAIL=$(denv env deployments "$BETA" | json_get "d['deployments'][0]['ID']" | xargs -I{} denv deployment get {} |
  json_get "' | '.join([p for p in d['phases'] if p['Name']=='prepare'][0]['Evidence']['builds']['app']['log_tail'])")
assert_contains "$TAIL" "boom-$N" "log tail in the evidence"

# Oversize: refused by the CLI before sending.
printf 'FROM busybox:1.36\n' > big/Dockerfile
truncate -s 33M big/blob
printf 'services:\n  app:\n    build: ./big\n' > big.yaml
OUT=$(denv deploy --project bld --env gamma -f big.yaml 2>&1) && die "oversize context deployed: $OUT"
assert_contains "$OUT" "is larger than 32 MiB (stopped at blob)"

denv env destroy $ENV >/dev/null; wait_destroyed $ENV
denv env destroy $BETA >/dev/null; wait_destroyed $BETA
docker rmi -f "$TAG" >/dev/null
