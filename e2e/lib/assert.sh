#!/usr/bin/env bash
# Small helpers for e2e cases. Every helper exits the case (non-zero) with a message
# naming what was expected.

die() { echo "assertion failed: $*" >&2; exit 1; }

# json_get <python-expression on `d`>  (reads JSON on stdin)
json_get() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

assert_eq() { [ "$1" = "$2" ] || die "${3:-value}: got '$1', want '$2'"; }
# (A pattern match, not `printf | grep -q`: under pipefail, grep -q leaving at its first
# match can make printf die of SIGPIPE and the pipeline fail although the text matched.)
assert_contains() { [[ "$1" == *"$2"* ]] || die "${3:-output} does not contain '$2': $1"; }

# env_id <project> <env name>
env_id() {
  denv project envs "$1" | json_get "[e for e in d['environments'] if e['Name']=='$2'][0]['ID']"
}

# exec_out <env> <service> <cmd...>: stdout of the command (fails on non-zero exit)
exec_out() {
  local env="$1" svc="$2"; shift 2
  local j; j="$(denv exec --service "$svc" "$env" -- "$@")" || die "exec failed: $*"
  local code; code="$(printf '%s' "$j" | json_get "d['exit_code']")"
  [ "$code" = 0 ] || die "exec '$*' exited $code: $j"
  printf '%s' "$j" | json_get "d['stdout'].strip()"
}

# api METHOD PATH [curl args...]: REST call (not in a subshell: call it plainly).
# Sets API_STATUS (HTTP status) and API_BODY (the body; binary bodies: API_BODY_FILE).
api() {
  local m="$1" p="$2"; shift 2
  API_BODY_FILE="$(mktemp)"
  API_STATUS=$(curl -sS -o "$API_BODY_FILE" -w '%{http_code}' -X "$m" "$DENV_SERVER$p" -H "Authorization: Bearer $DENV_API_KEY" "$@")
  API_BODY="$(cat "$API_BODY_FILE" 2>/dev/null | tr -d '\0')"
}

# wait_destroyed <env>
wait_destroyed() {
  for _ in $(seq 1 120); do
    [ "$(denv env get "$1" | json_get "d['environment']['Status']")" = destroyed ] && return 0
    sleep 0.5
  done
  die "environment $1 was not destroyed"
}
