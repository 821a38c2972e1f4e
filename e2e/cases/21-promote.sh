# denv promote runs the gates of x-denv.promote on forks of a version, then the target
# runs it. A sound version passes every gate and staging gets its data; a version whose
# replay is not deterministic fails at gate.replay, one whose invariant is broken fails
# at gate.invariants, and either way staging is left exactly as it was (same version,
# same running stack: a file written into it after the first promote is still there).
# The gate forks are gone afterwards, and denv sheet shows the gate record.
world() { # world <replay cmd> <invariant cmd>
  cat <<YAML
x-denv:
  warm: ["sh", "-c", "mkdir -p /data/orders && for i in 1 2 3; do echo order-\$i > /data/orders/\$i; done"]
  promote:
    replay:
      forks: 3
      commands:
        - {name: orders, service: db, cmd: ["sh", "-c", "$1"]}
    consistency:
      - {name: orders readable, service: db, cmd: ["sh", "-c", "cat /data/orders/* >/dev/null"]}
    invariants:
      - {name: orders kept, service: db, cmd: ["sh", "-c", "$2"]}
    soak: 2s
services:
  db:
    image: busybox:1.36
    command: ["sleep", "1000000"]
    volumes: ["data:/data"]
volumes: { data: {} }
YAML
}
world 'ls /data/orders | wc -l' 'test $(ls /data/orders | wc -l) -ge 3' > sound.yaml
world 'cat /proc/sys/kernel/random/uuid' 'true' > nondet.yaml
world 'ls /data/orders | wc -l' 'test -e /data/orders/4' > broken.yaml
denv project create pr >/dev/null
denv deploy --project pr -f sound.yaml >/dev/null
ALPHA=$(env_id pr alpha)
VER=$(denv env get $ALPHA | json_get "d['environment']['CurrentVersionID']")

# A sound version: every gate passes, staging (new) runs the version with its data.
denv promote pr alpha staging > promote.out || die "promote failed: $(cat promote.out)"
assert_contains "$(cat promote.out)" "promote" "the deployment header"
STAGING=$(env_id pr staging)
DEP=$(denv env deployments $STAGING | json_get "[x for x in d['deployments'] if x['Kind']=='promote'][0]['ID']")
STATES=$(denv deployment get $DEP | json_get "' '.join(p['Name']+'='+p['Status'] for p in d['phases'])")
assert_eq "$STATES" "gate.fork=ok gate.consistency=ok gate.replay=ok gate.invariants=ok gate.soak=ok apply=ok verdict=ok" "phases"
REPLAY_FORKS=$(denv deployment get $DEP | json_get "len([p for p in d['phases'] if p['Name']=='gate.replay'][0]['Evidence']['forks'])")
assert_eq "$REPLAY_FORKS" 3 "replay forks"
assert_eq "$(denv env get $STAGING | json_get "d['environment']['CurrentVersionID']")" "$VER" "staging runs the version"
assert_eq "$(exec_out $STAGING db cat /data/orders/3)" order-3 "staging has the version's data"
# The gate forks are destroyed after the verdict is recorded.
GATES=$(denv project envs pr | json_get "' '.join(e['ID'] for e in d['environments'] if e['Stage']=='gate')")
assert_eq "$(echo $GATES | wc -w)" 4 "gate forks"
for g in $GATES; do wait_destroyed $g; done

# The data sheet shows the record: datasets checked, gates passed.
denv sheet --project pr staging > sheet.txt
assert_contains "$(cat sheet.txt)" "gate.replay        ok" "sheet text"
assert_contains "$(cat sheet.txt)" "version     $VER" "sheet text"
SHEET=$(denv sheet --json $VER)
assert_eq "$(printf '%s' "$SHEET" | json_get "d['gates']['status']")" succeeded "sheet gates"
assert_eq "$(printf '%s' "$SHEET" | json_get "d['datasets']['data']['files']")" 3 "sheet datasets"
assert_contains "$(printf '%s' "$SHEET" | json_get "d['datasets']['data']['digest']")" "sha256:" "dataset digest"
assert_eq "$(printf '%s' "$SHEET" | json_get "d['egress']['result']")" "denied (verified)" "sheet egress proof"
api GET /v1/envs/$STAGING/sheet
assert_eq "$API_STATUS" 200 "REST sheet: $API_BODY"

# From here staging must not change: a marker written into its running stack.
exec_out $STAGING db sh -c 'echo kept > /data/marker' >/dev/null

# Not deterministic: fails at gate.replay, staging untouched.
denv deploy --project pr --env nondet -f nondet.yaml >/dev/null
if denv promote pr nondet staging > nd.out 2>&1; then die "a non-deterministic replay was promoted"; fi
assert_contains "$(cat nd.out)" "gate.replay: replay command \"orders\" is not deterministic" "replay failure"
ND=$(denv env deployments $STAGING | json_get "[x for x in d['deployments'] if x['Kind']=='promote'][0]['ID']")
STATES=$(denv deployment get $ND | json_get "' '.join(p['Name']+'='+p['Status'] for p in d['phases'])")
assert_eq "$STATES" "gate.fork=ok gate.consistency=ok gate.replay=failed gate.invariants=skipped gate.soak=skipped apply=skipped verdict=ok" "phases of the failed promote"
assert_eq "$(denv env get $STAGING | json_get "d['environment']['CurrentVersionID']")" "$VER" "staging keeps its version"
assert_eq "$(exec_out $STAGING db cat /data/marker)" kept "staging's stack was not touched"

# A broken invariant: fails at gate.invariants, staging untouched.
denv deploy --project pr --env broken -f broken.yaml >/dev/null
if denv promote pr broken staging > br.out 2>&1; then die "a broken invariant was promoted"; fi
assert_contains "$(cat br.out)" "gate.invariants: check \"orders kept\" failed (exit 1)" "invariant failure"
assert_eq "$(denv env get $STAGING | json_get "d['environment']['Status']")" healthy "staging status"
assert_eq "$(exec_out $STAGING db cat /data/marker)" kept "staging's stack was not touched"
# The sheet of the broken version records where it failed.
BROKEN_VER=$(denv env get $(env_id pr broken) | json_get "d['environment']['CurrentVersionID']")
assert_eq "$(denv sheet --json $BROKEN_VER | json_get "d['gates']['status']")" failed "the failed version's sheet"

# Refusals name the problem.
if denv promote pr alpha alpha 2>self.err >/dev/null; then die "promoted an environment to itself"; fi
assert_contains "$(cat self.err)" "cannot promote environment alpha to itself" "self promote"
if denv promote pr nope staging 2>nope.err >/dev/null; then die "promoted a missing environment"; fi
assert_contains "$(cat nope.err)" "environment nope not found in project pr" "missing source"

# Promote again to an existing target: its stack is replaced, the marker goes.
denv promote pr alpha staging >/dev/null || die "second promote failed"
assert_eq "$(denv exec --service db $STAGING -- cat /data/marker | json_get "d['exit_code']")" 1 "the target was replaced"
assert_eq "$(exec_out $STAGING db cat /data/orders/1)" order-1 "replaced target data"

for n in alpha staging nondet broken; do denv env destroy $(env_id pr $n) >/dev/null; done
for n in alpha staging nondet broken; do wait_destroyed $(env_id pr $n); done
for g in $(denv project envs pr | json_get "' '.join(e['ID'] for e in d['environments'] if e['Stage']=='gate')"); do
  wait_destroyed $g
done
rm -f sound.yaml nondet.yaml broken.yaml promote.out sheet.txt nd.out br.out self.err nope.err
