# Egress denied and proven by the probe; allow publishes ports as endpoints.
denv project create egress >/dev/null
printf 'services:\n  box:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n' > deny.yaml
OUT=$(denv deploy --project egress -f deny.yaml); echo "$OUT"
assert_contains "$OUT" "denied (verified)" "deploy output"
ENV=$(env_id egress alpha)
X=$(denv exec --service box $ENV -- wget -q -T 3 -O- http://1.1.1.1/ 2>&1 || true)
assert_eq "$(printf '%s' "$X" | json_get "d['exit_code'] != 0")" True "wget from a denied network"
printf 'x-denv: { egress: allow }\nservices:\n  web:\n    image: busybox:1.36\n    command: ["sh","-c","echo hello > /tmp/index.html; exec httpd -f -p 8000 -h /tmp"]\n    ports: ["8000"]\n' > allow.yaml
denv project create egress-allow >/dev/null
denv deploy --project egress-allow -f allow.yaml
ENV2=$(env_id egress-allow alpha)
EP=$(denv env get $ENV2 | json_get "d['environment']['Endpoints']['web']")
assert_contains "$EP" "127.0.0.1:" "endpoint"
assert_eq "$(curl -fsS "http://$EP/")" hello "page served through the published endpoint"
denv env destroy $ENV >/dev/null; denv env destroy $ENV2 >/dev/null
wait_destroyed $ENV; wait_destroyed $ENV2
