#!/usr/bin/env bash
# The Python client's tests (clients/python, pytest) against a real daemon
# and gateway on a loop-backed Btrfs store: installs the package into a
# fresh virtual environment (Debian's python3 and its httpx, pytest and
# jsonschema; openapi-spec-validator from PyPI) and runs every test.
#
#   sudo scripts/test-python.sh     # uses target/<triple>/debug binaries, built here
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
allox_need_root
allox_install_deps
cargo build --quiet -p allox-init -p allox-ctl -p allox-effects
debug=target/x86_64-unknown-linux-gnu/debug
# Debian's interpreter: the one its python3-* packages are for (another
# python3 may come first on PATH).
py=/usr/bin/python3
venv=$(mktemp -d /var/tmp/allox-python.XXXXXX)
trap 'rm -rf "$venv"' EXIT
"$py" -m venv --system-site-packages "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation ./clients/python
"$venv/bin/pip" install --quiet --disable-pip-version-check openapi-spec-validator
cd clients/python
ALLOX_INIT="$PWD/../../$debug/allox-init" ALLOXCTL="$PWD/../../$debug/alloxctl" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -q tests
