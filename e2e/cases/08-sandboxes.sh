# POST /v1/sandboxes in both forms.
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{"image":"python:3.12-slim","cmd":["sleep","infinity"]}'
BODY=$API_BODY
assert_eq "$API_STATUS" 201 "image sandbox status: $BODY"
SBX=$(printf '%s' "$BODY" | json_get "d['environment']['ID']")
assert_eq "$(printf '%s' "$BODY" | json_get "d['environment']['Status']")" healthy "sandbox status"
exec_out $SBX main sh -c 'echo kept > /work/k; echo lost > /tmp/l' >/dev/null
denv snapshot $SBX
VER=$(denv env get $SBX | json_get "d['environment']['CurrentVersionID']")
api POST /v1/sandboxes -H 'Content-Type: application/json' -d "{\"from_version\":\"$VER\",\"name\":\"ep-42\"}"
BODY=$API_BODY
assert_eq "$API_STATUS" 201 "from_version sandbox status: $BODY"
CHILD=$(printf '%s' "$BODY" | json_get "d['environment']['ID']")
assert_eq "$(printf '%s' "$BODY" | json_get "d['environment']['Name']")" ep-42 "sandbox name"
assert_eq "$(exec_out $CHILD main cat /work/k)" kept "volume carried by the fork"
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{}'
assert_eq "$API_STATUS" 400 "neither image nor from_version"
# Ports under the default deny: published on 127.0.0.1, and the sandbox is still denied.
api POST /v1/sandboxes -H 'Content-Type: application/json' -d '{"image":"busybox:1.36","cmd":["sh","-c","echo sbx-ok > /tmp/index.html; exec httpd -f -p 80 -h /tmp"],"ports":["80"]}'
BODY=$API_BODY
assert_eq "$API_STATUS" 201 "ports with egress deny: $BODY"
PORTS=$(printf '%s' "$BODY" | json_get "d['environment']['ID']")
EP=$(printf '%s' "$BODY" | json_get "d['environment']['Endpoints']['main']")
assert_eq "$(curl -fsS "http://$EP/")" sbx-ok "page of a denied sandbox through its endpoint"
denv env destroy $CHILD >/dev/null; denv env destroy $SBX >/dev/null; denv env destroy $PORTS >/dev/null
wait_destroyed $CHILD; wait_destroyed $SBX; wait_destroyed $PORTS
