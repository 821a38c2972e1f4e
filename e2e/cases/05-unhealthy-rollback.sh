# A deploy whose healthcheck never passes rolls back to the previous version, which
# still serves.
denv project create rb >/dev/null
printf 'services:\n  app:\n    image: busybox:1.36\n    command: ["sh","-c","echo v1 > /data/v; sleep 1000000"]\n    volumes: ["data:/data"]\n    healthcheck: { test: ["CMD", "test", "-f", "/data/v"], interval: 1s, retries: 5 }\nvolumes: { data: {} }\n' > v1.yaml
denv deploy --project rb -f v1.yaml
ENV=$(env_id rb alpha)
V1=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
printf 'services:\n  app:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["data:/data"]\n    healthcheck: { test: ["CMD", "false"], interval: 1s, retries: 3 }\nvolumes: { data: {} }\n' > v2.yaml
OUT=$(denv deploy --project rb -f v2.yaml 2>&1) && die "unhealthy deploy succeeded: $OUT"
echo "$OUT"
assert_contains "$OUT" "rolled_back"
assert_eq "$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")" "$V1" "current version after rollback"
assert_eq "$(exec_out $ENV app cat /data/v)" v1 "old version serves"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
