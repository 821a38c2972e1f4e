# Rollback to an older version restores its snapshot and spec.
denv project create rv >/dev/null
printf 'services:\n  app:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["data:/data"]\nvolumes: { data: {} }\n' > c.yaml
denv deploy --project rv -f c.yaml
ENV=$(env_id rv alpha)
exec_out $ENV app sh -c 'echo first > /data/f' >/dev/null
denv snapshot $ENV
V_FIRST=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
exec_out $ENV app sh -c 'echo second > /data/f' >/dev/null
denv snapshot $ENV
assert_eq "$(denv env versions $ENV | json_get "len(d['versions'])")" 3 "versions"
denv rollback $ENV $V_FIRST
assert_eq "$(exec_out $ENV app cat /data/f)" first "data after rollback"
assert_eq "$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")" "$V_FIRST" "current version"
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
