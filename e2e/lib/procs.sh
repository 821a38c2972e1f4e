# The stack's processes for cases that stop and start them (sourced by a case; needs
# lib/stack.sh's STACK_DIR, DENV_SERVER, DENV_API_KEY and lib/assert.sh's die).
PORT="${DENV_SERVER##*:}"
wait_for() { # wait_for <seconds> <what> <command...>
  local secs="$1" what="$2"; shift 2
  for _ in $(seq 1 $((secs * 5))); do "$@" && return 0; sleep 0.2; done
  die "$what (after ${secs}s)"
}
start_denvd() {
  (exec denvd run --state "$STACK_DIR/host.json" >>"$STACK_DIR/denvd.log" 2>&1) &
  echo $! >"$STACK_DIR/denvd.pid"
}
kill_denvd() { kill -9 "$(cat "$STACK_DIR/denvd.pid")"; sleep 0.3; }
# start_cp: a new denv-cp on the stack's port and database (variables such as
# DENV_RESUME_WAIT set on the call reach it).
start_cp() {
  (cd "$STACK_DIR" && DENV_BOOTSTRAP_KEY="$DENV_API_KEY" exec denv-cp -addr "127.0.0.1:$PORT" -db "$STACK_DIR/denv.db" \
      -public-url "$DENV_SERVER" >>"$STACK_DIR/cp.log" 2>&1) &
  echo $! >"$STACK_DIR/cp.pid"
  wait_for 30 "denv-cp answers /health" curl -fsS -o /dev/null "$DENV_SERVER/health"
}
kill_cp() { kill -9 "$(cat "$STACK_DIR/cp.pid")"; sleep 0.3; }
connected() { denv host list | json_get "d['hosts'][0]['connected']"; }
is_connected() { [ "$(connected)" = "$1" ]; }
# dep_is <deployment> <status>; phase_is <deployment> <phase> <status>
dep_is() { [ "$(denv deployment get "$1" | json_get "d['deployment']['Status']")" = "$2" ]; }
phase_is() { [ "$(denv deployment get "$1" | json_get "[p['Status'] for p in d['phases'] if p['Name']=='$2'][0]")" = "$3" ]; }
