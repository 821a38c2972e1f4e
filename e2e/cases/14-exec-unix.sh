# denv exec: the engine's exec user/workdir/stdin/env, caps as fields, and the Unix mode
# (--stream/-i) through the real stack: output streamed as written, the command's exit
# code, stdin passed, 125 when denv itself fails; plain exec keeps its JSON; the REST
# form of the stream (JSON lines).
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{"image":"busybox:1.36","cmd":["sleep","infinity"]}'
assert_eq "$API_STATUS" 201 "sandbox: $API_BODY"
SBX=$(printf '%s' "$API_BODY" | json_get "d['environment']['ID']")

# Plain exec: JSON, exit 0 whatever the command's code; the new fields are there.
J=$(denv exec --service main -u nobody -w /tmp -e 'V=a b' $SBX -- sh -c 'id -u; pwd; echo "$V"; exit 3')
assert_eq "$(printf '%s' "$J" | json_get "d['exit_code']")" 3 "plain exec exit_code"
assert_eq "$(printf '%s' "$J" | json_get "d['stdout']")" "$(printf '65534\n/tmp\na b\n')" "user/workdir/env"
assert_eq "$(printf '%s' "$J" | json_get "d['stdout_truncated']")" False "stdout_truncated"
J=$(printf 'from a pipe' | denv exec --service main --input - $SBX -- cat)
assert_eq "$(printf '%s' "$J" | json_get "d['stdout']")" "from a pipe" "--input -"
J=$(denv exec --service main $SBX -- sh -c 'head -c 5000000 /dev/zero')
assert_eq "$(printf '%s' "$J" | json_get "d['stdout_truncated'], len(d['stdout'])")" "True 4194304" "cap reported in a field"
# A user string that is more than a user is refused before anything runs.
if denv exec --service main -u 'root;id' $SBX -- true 2>exec-unix-err; then die "a user with ; was accepted"; fi
assert_contains "$(cat exec-unix-err)" "is not a user" "refused user"

# Unix mode: the command's exit code, stdout and stderr apart.
set +e
OUT=$(denv exec --stream --service main $SBX -- sh -c 'echo out; echo err >&2; exit 7' 2>exec-unix-err)
RC=$?
set -e
assert_eq "$RC" 7 "--stream exit code"
assert_eq "$OUT" out "--stream stdout"
assert_eq "$(cat exec-unix-err)" err "--stream stderr"
# Streaming: the first line is here while the command still sleeps.
T0=$(date +%s%N)
FIRST=$(denv exec --stream --service main $SBX -- sh -c 'echo first; sleep 3; echo last' | head -1)
T1=$(date +%s%N)
assert_eq "$FIRST" first "first streamed line"
denv exec --stream --service main $SBX -- sh -c 'echo a; sleep 2; echo b' | while read -r l; do echo "$l $(date +%s%N)"; done > exec-unix-lines
A=$(sed -n 1p exec-unix-lines | cut -d' ' -f2); B=$(sed -n 2p exec-unix-lines | cut -d' ' -f2)
[ $(( (B - A) / 1000000 )) -ge 1500 ] || die "lines arrived together ($(cat exec-unix-lines)): not streamed"
# stdin with -i; more than 4 MiB streams whole.
assert_eq "$(printf 'hello\nworld\n' | denv exec -i --service main $SBX -- sort -r)" "$(printf 'world\nhello')" "-i stdin"
assert_eq "$(denv exec --stream --service main $SBX -- sh -c 'head -c 5000000 /dev/zero' | wc -c | tr -d ' ')" 5000000 "--stream has no 4 MiB cap"
# denv's own failure: 125, not a command code.
set +e
denv exec --stream --service nosuch $SBX -- true 2>exec-unix-err; RC=$?
set -e
assert_eq "$RC" 125 "denv failure exit code"
assert_contains "$(cat exec-unix-err)" "nosuch" "failure names the service"
# The REST form: JSON lines, base64 pieces as they are written, then the result.
curl -sN -X POST "$DENV_SERVER/v1/envs/$SBX/exec/stream" -H "Authorization: Bearer $DENV_API_KEY" \
  -H 'Content-Type: application/json' \
  -d '{"service":"main","cmd":["sh","-c","echo a; echo e >&2; sleep 2; printf b; exit 5"]}' |
  while read -r l; do [ -n "$l" ] && echo "$(date +%s%N) $l"; done > exec-unix-rest
python3 - exec-unix-rest <<'PY' || die "REST exec stream: $(cat exec-unix-rest)"
import base64, json, sys
rows = [l.split(" ", 1) for l in open(sys.argv[1]).read().splitlines()]
chunks = [(int(t), json.loads(j)) for t, j in rows]
out = b"".join(base64.b64decode(c.get("stdout", "")) for _, c in chunks)
err = b"".join(base64.b64decode(c.get("stderr", "")) for _, c in chunks)
assert out == b"a\nb" and err == b"e\n", (out, err)
assert chunks[-1][1]["result"]["exit_code"] == 5, chunks[-1]
first_a = next(t for t, c in chunks if c.get("stdout"))
last_b = [t for t, c in chunks if c.get("stdout")][-1]
assert (last_b - first_a) / 1e6 >= 1500, "pieces arrived together: not streamed"
PY
# A refused request, an unknown service too, is an error status before the stream.
api POST "/v1/envs/$SBX/exec/stream" -H 'Content-Type: application/json' -d '{"service":"main","cmd":[]}'
assert_eq "$API_STATUS" 400 "REST exec stream without cmd: $API_BODY"
assert_contains "$API_BODY" "cmd is required" "REST exec stream refusal"
api POST "/v1/envs/$SBX/exec/stream" -H 'Content-Type: application/json' -d '{"service":"nosuch","cmd":["true"]}'
assert_eq "$API_STATUS" 400 "REST exec stream, unknown service: $API_BODY"
assert_contains "$API_BODY" 'unknown service \"nosuch\": the services of' "REST exec stream refusal names the service"
rm -f exec-unix-err exec-unix-lines exec-unix-rest
: "$T0" "$T1"

denv env destroy $SBX >/dev/null
wait_destroyed $SBX
