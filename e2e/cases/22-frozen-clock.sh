# x-denv.clock: frozen through the CLI. A stack (the ubuntu stand-in's coreutils `date`,
# Python's time.time(), PostgreSQL's now()) is deployed and snapshotted; three forks made
# seconds apart each start every service's wall clock at the snapshot's world instant,
# while real time moves on. The same stack with clock: real forks on the host's clock.
#
# Tolerance. A fork's clock starts at some real instant F inside its `denv fork` command
# [R0, R1]; a service's reading V is taken at some real instant inside its `denv exec`
# [A, B]. The world instant at the fork's start the service implies is V − (t − F), which
# lies in [V − (B − R0), V − (A − R1)]: the tolerance is the fork's own duration plus the
# exec's, measured, not guessed. The snapshot's instant must lie in that interval for
# every service of every fork, and the forks are spread over more real time than the
# widest interval. The sidecar's reported offset (clone evidence) is checked tightly on
# top: reading − offset lies within the exec's real bounds.
now_ms() { date +%s%3N; }
cat > clock.py <<'PY'
import json, sys
# argv: mode W R0 R1 OFFSET then triples (service, value_s, A, B)
mode, W, R0, R1, OFF = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rest = sys.argv[6:]
slack = 5  # ms: readings' resolution (date ns, Python/PostgreSQL µs) and ms rounding
widest = 0
for i in range(0, len(rest), 4):
    svc, v, a, b = rest[i], round(float(rest[i + 1]) * 1000), int(rest[i + 2]), int(rest[i + 3])
    if mode == "frozen":
        lo, hi = v - (b - R0), v - (a - R1)
        widest = max(widest, hi - lo)
        if not (lo - slack <= W <= hi + slack):
            sys.exit(f"{svc}: reads {v}, so its fork started at [{lo}, {hi}] on its clock, not at the snapshot's {W}")
    real = v - OFF
    if not (a - slack <= real <= b + slack):
        sys.exit(f"{svc}: reads {v}; minus the offset {OFF} that is {real}, outside the exec's real [{a}, {b}]")
print(widest)
PY

# read_clocks <env>: "service value A B" for the three services
read_clocks() {
  local env="$1" a v b
  for spec in "shell|date +%s.%N" "py|python3 -c 'import time; print(time.time())'" \
              "db|psql -U postgres -Atc 'select extract(epoch from now())'"; do
    local svc="${spec%%|*}" cmd="${spec#*|}"
    a=$(now_ms); v=$(exec_out "$env" "$svc" sh -c "$cmd"); b=$(now_ms)
    printf '%s %s %s %s ' "$svc" "$v" "$a" "$b"
  done
}

clone_clock() { # <env>: the clone phase's clock evidence of its fork deployment
  local dep
  dep=$(denv env deployments "$1" | json_get "[x for x in d['deployments'] if x['Kind']=='fork'][0]['ID']")
  denv deployment get "$dep" | json_get "json.dumps([p for p in d['phases'] if p['Name']=='clone'][0]['Evidence']['clock'], sort_keys=True)"
}

for CLOCK in frozen real; do
  cat > clock-$CLOCK.yaml <<YAML
x-denv:
  clock: $CLOCK
services:
  db:
    image: postgres:16-alpine
    environment: { POSTGRES_PASSWORD: world }
    volumes: ["pg:/var/lib/postgresql/data"]
    healthcheck: { test: ["CMD-SHELL", "pg_isready -U postgres"], interval: 1s, retries: 60 }
  py:
    image: python:3.12-slim
    command: ["sleep", "infinity"]
  shell:
    image: ubuntu:24.04
    command: ["sleep", "infinity"]
volumes: { pg: {} }
YAML
  denv project create clk-$CLOCK >/dev/null
  denv deploy --project clk-$CLOCK -f clock-$CLOCK.yaml >/dev/null
  ENV=$(env_id clk-$CLOCK alpha)
  # A first deploy runs on the real clock.
  python3 clock.py real 0 0 0 0 $(read_clocks $ENV) >/dev/null || die "$CLOCK: the first deploy is not on the real clock"
  T0=$(now_ms); denv snapshot $ENV >/dev/null; T1=$(now_ms)
  VER=$(denv env get $ENV | json_get "d['environment']['CurrentVersionID']")
  W=$(denv env versions $ENV | json_get "[v for v in d['versions'] if v['ID']=='$VER'][0]['Spec']['world_instant_ms']")
  [ "$W" -ge "$T0" ] && [ "$W" -le "$T1" ] || die "$CLOCK: the snapshot's instant $W is not within the snapshot command [$T0, $T1]"
  SDEP=$(denv env deployments $ENV | json_get "[x for x in d['deployments'] if x['Kind']=='snapshot'][0]['ID']")
  assert_eq "$(denv deployment get $SDEP | json_get "[p for p in d['phases'] if p['Name']=='snapshot'][0]['Evidence']['clock']['world_instant_ms']")" "$W" "$CLOCK: snapshot evidence"

  N=3; [ $CLOCK = real ] && N=1
  FIRST=""; LAST=""; WIDEST=0; FORKS=()
  for i in $(seq 1 $N); do
    [ "$i" = 1 ] || sleep 6
    R0=$(now_ms); denv fork --name f$i $ENV >/dev/null; R1=$(now_ms)
    F=$(env_id clk-$CLOCK f$i); FORKS+=($F)
    EV=$(clone_clock $F)
    OFF=$(printf '%s' "$EV" | json_get "d.get('offset_ms', 0)")
    if [ $CLOCK = frozen ]; then
      assert_eq "$(printf '%s' "$EV" | json_get "(d['mode'], d['world_instant_ms'])")" "('frozen', $W)" "fork $i: clone evidence"
      S=$((W - OFF))
      [ "$S" -ge "$R0" ] && [ "$S" -le "$R1" ] || die "fork $i: offset $OFF puts its start at real $S, outside [$R0, $R1]"
    else
      assert_eq "$EV" '{"mode": "real"}' "real: clone evidence"
    fi
    w=$(python3 clock.py $CLOCK $W $R0 $R1 $OFF $(read_clocks $F)) || die "$CLOCK fork $i: see above"
    [ "$w" -gt "$WIDEST" ] && WIDEST=$w
    [ -n "$FIRST" ] || FIRST=$R0; LAST=$R0
    echo "$CLOCK fork $i: offset ${OFF} ms, tolerance ${w} ms, real $((R0 - T1)) ms after the snapshot"
  done
  if [ $CLOCK = frozen ]; then
    [ $((LAST - FIRST)) -gt "$WIDEST" ] || die "the forks were $((LAST - FIRST)) ms apart, not more than the tolerance $WIDEST ms"
    # The library is read-only inside; a process that drops LD_PRELOAD sees the real clock.
    WR=$(denv exec --service shell ${FORKS[0]} -- sh -c 'echo x >> /run/denv/libfaketime.so.1')
    [ "$(printf '%s' "$WR" | json_get "d['exit_code']")" != 0 ] || die "libfaketime is writable in the container: $WR"
    A=$(now_ms); V=$(exec_out ${FORKS[0]} shell env -u LD_PRELOAD date +%s.%N); B=$(now_ms)
    python3 clock.py real 0 0 0 0 shell "$V" "$A" "$B" >/dev/null || die "without LD_PRELOAD the real clock shows"
  fi
  for e in "${FORKS[@]}" $ENV; do denv env destroy $e >/dev/null; done
  for e in "${FORKS[@]}" $ENV; do wait_destroyed $e; done
done
assert_contains "$(denv host list)" '"clock": "libfaketime ' "the host reports its clock capability"
rm -f clock.py clock-frozen.yaml clock-real.yaml
