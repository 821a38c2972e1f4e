#!/usr/bin/env bash
# End-to-end suite: real denv-cp + denvd processes against the real Docker engine,
# driven by the real CLI (and curl for REST routes). Runs every case on each storage
# backend: `dir`, `btrfs` (lib/btrfs.sh's loop file system) and `zfs` (lib/zfs.sh's
# pool on zfs-fuse). Prints one line per case and backend,
#   PASS 01-quickstart/zfs (41s)      or      FAIL 01-quickstart/zfs (41s) followed by
# the case's output, what made it fail and both logs, and ends with the plain closing
# line `e2e: N passed, N failed`. Exits non-zero on any failure.
#
#   bash e2e/run.sh                                    # every case, dir btrfs zfs
#   E2E_STORAGE=dir bash e2e/run.sh quickstart files   # a subset on one backend
#   E2E_PARALLEL=1 bash e2e/run.sh                     # the backends at the same time
#
# Each case (one file of cases/) gets a FRESH stack (lib/stack.sh: its own denv-cp,
# SQLite database, denvd and data directory), so nothing one case leaves behind can
# make another pass or fail. A case fails when:
#   - a command of it fails (it runs under `set -e`; lib/assert.sh's helpers exit), or
#   - denv-cp or denvd logged an ERROR line (tracing's `<time> ERROR <target>: …`)
#     between the stack's start and the case's end that the case does not allow.
#     A case allows the errors it provokes on purpose with lines in its file
#         # allow-error: <extended regex matched against the log line>
#     (cases/07-files.sh allows the control plane's ERROR for the 502 it asks for); or
#   - anything of its environments is still on the machine when it ends: a container or
#     network labelled `denv.env=<id>` for an environment id of its stack (the control
#     plane's environments plus the sidecar's data directory), an entry under the data
#     directory's envs/ or snaps/, a btrfs subvolume or zfs dataset of the stack. Every
#     leftover is named. The harness then removes them (stack_down) either way.
#
# A failed case's whole cp.log and denvd.log are kept under $E2E_KEEP_LOGS (default
# /tmp/denv-e2e-failed/<case>-<backend>/).
#
# E2E_PARALLEL=1 runs each backend's cases in its own process (own stacks; they share
# the Docker engine) and prints each backend's lines in the order of E2E_STORAGE once
# that backend is done. E2E_ZFS_POOL (default denve2e) names the zfs pool.
set -uo pipefail
E2E="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/stack.sh
source "$E2E/lib/stack.sh"
# shellcheck source=lib/assert.sh
source "$E2E/lib/assert.sh"

CASES=("$@")
[ ${#CASES[@]} -eq 0 ] && mapfile -t CASES < <(ls "$E2E/cases" | sed -n 's/^\([0-9][0-9]-\)\?\(.*\)\.sh$/\1\2/p')
read -r -a STORAGES <<<"${E2E_STORAGE:-dir btrfs zfs}"
# A failed case's two logs are copied here (for CI artifacts), one directory per case.
KEEP_DIR="${E2E_KEEP_LOGS:-/tmp/denv-e2e-failed}"

# case_file NAME: cases/NAME.sh or cases/NN-NAME.sh
case_file() {
  local f="$E2E/cases/$1.sh"
  [ -f "$f" ] || f="$(ls "$E2E"/cases/*-"$1".sh 2>/dev/null | head -1)"
  printf '%s' "$f"
}

# log_size FILE: its size in bytes (0 when missing).
log_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

# unexpected_errors CASEFILE CP_OFFSET DENVD_OFFSET: the ERROR lines both logs got past
# the offsets that no `# allow-error:` line of CASEFILE matches, each prefixed by its log.
unexpected_errors() {
  local f="$1" log off line re allowed
  local -a allow=()
  mapfile -t allow < <(sed -n 's/^# allow-error: *//p' "$f")
  for log in cp:"$2" denvd:"$3"; do
    off="${log#*:}"; log="${log%%:*}"
    tail -c +"$((off + 1))" "$STACK_DIR/$log.log" 2>/dev/null | grep -E '^[^ ]+ +ERROR ' | while IFS= read -r line; do
      allowed=0
      for re in "${allow[@]}"; do
        [[ "$line" =~ $re ]] && { allowed=1; break; }
      done
      [ $allowed = 1 ] || printf '%s.log: %s\n' "$log" "$line"
    done
  done
}

# kill_tree PID: TERM to PID and all its descendants, children first.
kill_tree() {
  local c
  for c in $(pgrep -P "$1" 2>/dev/null); do kill_tree "$c"; done
  kill -TERM "$1" 2>/dev/null || true
}

# run_case STORAGE CASEFILE: one case on a fresh stack; prints its PASS/FAIL line (and
# on failure the details). Returns non-zero on failure.
run_case() {
  local storage="$1" f="$2" name; name="$(basename "$f" .sh)/$storage"
  local start; start=$(date +%s)
  local out work report; out="$(mktemp)"; work="$(mktemp -d)"; report="$(mktemp)"
  local ok=1 flag=""
  [ "$storage" = dir ] || flag="--$storage"
  if ! stack_up $flag >"$out" 2>&1; then
    ok=0; echo "stack_up --$storage failed" >>"$report"
  else
    local cp_off=0 d_off=0   # a fresh stack: everything it logged counts
    # A case that hangs (an engine or a file system that stops answering) fails after
    # E2E_CASE_TIMEOUT seconds, its processes killed, instead of holding the whole run.
    ( set -e; cd "$work"; source "$f" ) >>"$out" 2>&1 &
    local case_pid=$! waited=0 limit="${E2E_CASE_TIMEOUT:-600}"
    while kill -0 "$case_pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
      sleep 1; waited=$((waited+1))
    done
    if kill -0 "$case_pid" 2>/dev/null; then
      kill_tree "$case_pid"
      wait "$case_pid" 2>/dev/null || true
      ok=0; echo "the case did not finish within ${limit}s (E2E_CASE_TIMEOUT); its processes were killed" >>"$report"
    elif ! wait "$case_pid"; then
      ok=0; echo "the case failed (its output above)" >>"$report"
    fi
    local errs; errs="$(unexpected_errors "$f" "$cp_off" "$d_off")"
    if [ -n "$errs" ]; then
      ok=0; { echo "unexpected ERROR lines in the logs (allow with '# allow-error: <regex>'):"; printf '%s\n' "$errs" | sed 's/^/  /'; } >>"$report"
    fi
    local left; left="$(stack_leftovers)"
    if [ -n "$left" ]; then
      ok=0; { echo "left behind by the case:"; printf '%s\n' "$left" | sed 's/^/  /'; } >>"$report"
    fi
  fi
  local logs; logs="$(mktemp)"
  if [ $ok = 0 ] && [ -n "${STACK_DIR:-}" ]; then
    stack_logs 80 >>"$logs"
    local keep="$KEEP_DIR/$(basename "$f" .sh)-$storage"
    mkdir -p "$keep" && cp "$STACK_DIR"/*.log "$keep"/ 2>/dev/null && echo "whole logs kept in $keep" >>"$logs"
  fi
  local down; down="$(stack_down 2>&1)" || { ok=0; printf '%s\n' "$down" >>"$report"; }
  local secs=$(( $(date +%s) - start ))
  if [ $ok = 1 ]; then
    echo "PASS $name (${secs}s)"
  else
    # Why first, and the case's own last lines (where an assertion names what it
    # expected) before its earlier output, so a truncated CI log still shows both.
    echo "FAIL $name (${secs}s)"
    { cat "$report"; echo "-- the case's last 15 lines:"; tail -n 15 "$out"
      echo "-- the case's output (last 60 lines):"; tail -n 60 "$out"; echo "--"; cat "$logs"; } | sed 's/^/    /'
  fi
  rm -rf "$out" "$work" "$report" "$logs"
  [ $ok = 1 ]
}

# run_backend STORAGE RESULTFILE: every case on STORAGE; writes "passed failed names…".
run_backend() {
  local storage="$1" res="$2" passed=0 failed=0 failures=() c f t0; t0=$(date +%s)
  for c in "${CASES[@]}"; do
    f="$(case_file "$c")"
    if [ ! -f "$f" ]; then
      echo "FAIL $c/$storage (no such case)"; failed=$((failed+1)); failures+=("$c/$storage"); continue
    fi
    if run_case "$storage" "$f"; then passed=$((passed+1)); else failed=$((failed+1)); failures+=("$(basename "$f" .sh)/$storage"); fi
  done
  echo "backend $storage: $passed passed, $failed failed in $(( $(date +%s) - t0 ))s"
  echo "$passed $failed ${failures[*]}" >"$res"
}

resdir="$(mktemp -d)"
if [ "${E2E_PARALLEL:-0}" = 1 ] && [ ${#STORAGES[@]} -gt 1 ]; then
  declare -A pids=()
  for s in "${STORAGES[@]}"; do
    ( run_backend "$s" "$resdir/$s.res" ) >"$resdir/$s.out" 2>&1 &
    pids[$s]=$!
  done
  for s in "${STORAGES[@]}"; do
    wait "${pids[$s]}"
    cat "$resdir/$s.out"
  done
else
  for s in "${STORAGES[@]}"; do run_backend "$s" "$resdir/$s.res"; done
fi

passed=0; failed=0; failures=()
for s in "${STORAGES[@]}"; do
  read -r p fl names <"$resdir/$s.res" 2>/dev/null || { p=0; fl=1; names="$s(no result)"; }
  passed=$((passed+p)); failed=$((failed+fl))
  [ -n "${names:-}" ] && failures+=($names)
done
rm -rf "$resdir"

echo
[ ${#failures[@]} -gt 0 ] && printf 'failed: %s\n' "${failures[*]}"
echo "e2e: $passed passed, $failed failed"
[ $failed -eq 0 ]
