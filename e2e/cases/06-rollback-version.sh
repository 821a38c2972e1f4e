# Rollback to an older version restores its snapshot and spec. The later versions stay:
# a fork of one keeps running through the rollback, and one can still be forked after.
denv project create rv >/dev/null
printf 'services:\n  app:\n    image: busybox:1.36\n    command: ["sleep","1000000"]\n    volumes: ["data:/data"]\nvolumes: { data: {} }\n' > c.yaml
denv deploy --project rv -f c.yaml
ENV=$(env_id rv alpha)
exec_out $ENV app sh -c 'echo first > /data/f' >/dev/null
denv snapshot $ENV
V_FIRST=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
exec_out $ENV app sh -c 'echo second > /data/f' >/dev/null
denv snapshot $ENV
V_SECOND=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
assert_eq "$(denv env versions $ENV | json_get "len(d['versions'])")" 3 "versions"
denv fork --name before $ENV >/dev/null
BEFORE=$(env_id rv before)
denv rollback $ENV $V_FIRST
assert_eq "$(exec_out $ENV app cat /data/f)" first "data after rollback"
assert_eq "$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")" "$V_FIRST" "current version"
assert_eq "$(exec_out $BEFORE app cat /data/f)" second "fork of the later version after the rollback"
denv fork --name after --version $V_SECOND $ENV >/dev/null
AFTER=$(env_id rv after)
assert_eq "$(exec_out $AFTER app cat /data/f)" second "fork of the later version made after the rollback"
# the parent first: its forks keep their data
denv env destroy $ENV >/dev/null; wait_destroyed $ENV
assert_eq "$(exec_out $BEFORE app cat /data/f)" second "fork after its parent was destroyed"
denv env destroy $BEFORE >/dev/null; denv env destroy $AFTER >/dev/null
wait_destroyed $BEFORE; wait_destroyed $AFTER
