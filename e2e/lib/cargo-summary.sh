#!/usr/bin/env bash
# Sums the `test result:` lines of a `cargo test` log (and the `Summary` lines of a
# `cargo nextest run` log) into one plain closing line.
#
#   e2e/lib/cargo-summary.sh TIER LOG   # prints "TIER: N passed, N failed" (", N skipped"
#                                       # when tests were ignored)
#
# With DENV_FAILURES set to a file, each failed test's panic (the `panicked at` line and
# the message after it) is appended there, so the end of a long CI log can say why.
set -euo pipefail
tier=${1:?usage: cargo-summary.sh TIER LOG}
log=${2:?usage: cargo-summary.sh TIER LOG}
awk -v tier="$tier" '
  /^test result:/ { p += $4; f += $6; i += $8; n++ }
  # cargo-nextest: "Summary [ 12.3s] 250 tests run: 247 passed, 2 failed, 1 timed out, 5 skipped"
  /^ *Summary \[/ {
    n++
    for (k = 1; k <= NF; k++) {
      w = $(k + 1); sub(/,$/, "", w)
      if (w == "passed") p += $k
      if (w == "failed" || w == "timed") f += $k
      if (w == "skipped") i += $k
    }
  }
  /could not compile/ { broke = 1 }
  END {
    if (n == 0 || broke) f += 1   # a binary that did not build or run counts as a failure
    line = sprintf("%s: %d passed, %d failed", tier, p, f)
    if (i > 0) line = line sprintf(", %d skipped", i)
    print line
  }' "$log"
if [ -n "${DENV_FAILURES:-}" ]; then
  awk -v tier="$tier" '
    /panicked at/ { sub(/^ +/, ""); printf "%s: %s\n", tier, $0; grab = 1; next }
    grab { sub(/^ +/, ""); printf "%s:   %s\n", tier, substr($0, 1, 300); grab = 0 }
  ' "$log" | head -n 60 >>"$DENV_FAILURES"
fi
