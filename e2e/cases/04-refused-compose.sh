# A refused compose file: 400 with the parser's message, and nothing deployed.
denv project create refused >/dev/null
printf 'services:\n  web:\n    image: busybox:1.36\n    privileged: true\n' > bad.yaml
OUT=$(denv deploy --project refused -f bad.yaml 2>&1) && die "deploy of a privileged service succeeded"
assert_contains "$OUT" 'compose: service "web" asks for privileged, which is refused'
api POST /v1/projects/refused/deploy -H 'Content-Type: application/json' \
  -d "$(python3 -c 'import json;print(json.dumps({"compose": open("bad.yaml").read()}))')"
BODY=$API_BODY
assert_eq "$API_STATUS" 400 "REST status"
assert_contains "$BODY" '"error"'
ENV=$(env_id refused alpha)
assert_eq "$(denv env deployments $ENV | json_get "len(d['deployments'])")" 0 "deployments after refusals"
