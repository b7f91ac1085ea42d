#!/usr/bin/env bash
# Runs every test: format and lint checks, unit tests (no privileges), the
# integration tests on real loop-backed Btrfs (root) — the container image
# under podman among them —, the release binaries stripped (their sizes
# printed; built, and the fuzz targets after them, in the background at
# the lowest priority while the tests above run), the VM tests, and beside
# them, at the lowest priority (scripts/test-beside-vm.sh): the core's
# tests again on an allox-init built without plugins, the Python client's
# and the deployment manifests' tests, and the protocol fuzz targets for a
# bounded time. Installs what it needs. Ends with the 20 slowest tests and
# the time it took.
#
#   sudo scripts/test.sh            # everything
#   FUZZ_SECONDS=0 scripts/test.sh  # skip the fuzz run (it is still built)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
allox_need_root
allox_install_deps

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
export CARGO_TERM_COLOR=never
# Every test binary reports each test's time (listed at the end).
export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=$PWD/scripts/test-runner.sh

# Each step says when it starts (seconds since the script began), so the
# log shows where the time goes.
step() { echo; echo "==> $* [at $((SECONDS / 60)) min $((SECONDS % 60)) s]"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "build every target, linted: the workspace's crates compiled by clippy-driver (cargo clippy --all-targets -- -D warnings, in the same pass)"
# `cargo clippy` is `cargo check` with clippy-driver (rustc and the lints)
# as the workspace's compiler: its check of every dependency, and of the
# workspace itself, came beside the build's compile of each. Here the
# build itself goes through clippy-driver, with `-D warnings` as cargo
# clippy passes it (CLIPPY_ARGS): every target of every crate of the
# workspace is linted as it is compiled, once. Exported, so every cargo
# below (and the tests' own builds) sees the same compiler and finds
# these builds fresh; the release build and the fuzz targets use plain
# rustc (scripts/build-release.sh, scripts/fuzz.sh).
if command -v rustup >/dev/null 2>&1; then
    clippy_driver=$(rustup which clippy-driver)
else
    clippy_driver=$(command -v clippy-driver) || {
        echo "error: no clippy-driver (apt-get install rust-clippy, or rustup component add clippy)" >&2
        exit 1
    }
fi
export RUSTC_WORKSPACE_WRAPPER=$clippy_driver
export CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__
# The same selections of packages as the test steps below: cargo resolves
# the dependencies' features per selection, so `--workspace` would build
# other variants of half the workspace than those steps then build again.
cargo build --workspace --exclude allox-integration --all-targets --quiet
cargo build -p allox-integration --all-targets --quiet

step "allox-init without plugins (cargo build -p allox-init --no-default-features, every target, linted) into target/no-plugins"
# Its own copy: the tests build the default allox-init again where cargo
# puts it.
cargo build --quiet -p allox-init --no-default-features --all-targets
mkdir -p target/no-plugins
cp "$ALLOX_DEBUG/allox-init" target/no-plugins/allox-init
cargo build --quiet -p allox-init -p allox-ctl -p allox-effects

LOG=$(mktemp)
RELEASE=$(mktemp)
release_pid=""
beside_pid=""
py_passed=0
# A failed step leaves nothing of its own running behind it.
trap '[ -z "$release_pid" ] || kill -- -"$release_pid" 2>/dev/null; [ -z "$beside_pid" ] || kill -- -"$beside_pid" 2>/dev/null
    rm -f "$LOG" "$LOG".beside.* "$RELEASE" "$RELEASE.err" "$RELEASE.fuzz"' EXIT

step "release binaries and fuzz targets: built in the background, at the lowest CPU and I/O priority, while the tests run"
# The tests leave a core idle much of the time (they wait for the disk,
# the loop devices, their daemons); the release build (which no test
# before the VM tests uses) takes that time instead of six minutes of its
# own. Its own process group, so that the trap can stop all of it. A new
# session is also a scheduling group of its own where the kernel groups
# sessions (autogroup), and a nice value counts only within the group:
# the group gets the same nice value (set from inside the new session).
# The fuzz targets are built after it, likewise (`scripts/fuzz.sh 0`
# builds without running); their step below builds again, which is then
# nothing to do, or says what failed.
setsid bash -c 'echo 19 2>/dev/null >/proc/self/autogroup
    nice -n 19 ionice -c 3 scripts/build-release.sh >"$0" 2>"$0.err" || exit 1
    env -u CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER nice -n 19 ionice -c 3 scripts/fuzz.sh 0 >"$0.fuzz" 2>&1 || true' \
    "$RELEASE" &
release_pid=$!

step "unit tests (no privileges)"
cargo test --workspace --exclude allox-integration 2>&1 | tee -a "$LOG"
# The supervisor's own tests without any plugin built in.
cargo test -p allox-supervisor --no-default-features 2>&1 | tee -a "$LOG"

step "integration tests (root, loop devices, Btrfs)"
# Every target of tests/tests but the VM ones, which run after the guest
# image is built.
targets=()
for t in tests/tests/*.rs; do
    t=$(basename "$t" .rs)
    case $t in vm | powercut) ;; *) targets+=(--test "$t") ;; esac
done
ALLOX_REQUIRE_PRIVILEGED=1 cargo test -p allox-integration --lib --bins "${targets[@]}" -- --test-threads=2 2>&1 | tee -a "$LOG"

step "release binaries: each one's size as built and stripped; none may keep .debug_info (it goes to NAME.debug)"
if ! wait "$release_pid"; then
    release_pid=""
    cat "$RELEASE.err" >&2
    echo "error: the release build (scripts/build-release.sh) failed" >&2
    exit 1
fi
release_pid=""
cat "$RELEASE.err"
eval "$(cat "$RELEASE")"
[ -n "${ALLOX_BIN_DIR:-}" ] || { echo "error: scripts/build-release.sh named no ALLOX_BIN_DIR" >&2; exit 1; }
export ALLOX_BIN_DIR

step "guest image: kernel (cached by config hash), static allox-init, initramfs"
allox_install_guest_deps
eval "$(scripts/build-guest.sh | tail -2)"
export ALLOX_KERNEL_DIR ALLOX_INITRD

step "VM tests (QEMU; TCG unless the host has real KVM); meanwhile, at the lowest priority: the core's integration tests again on allox-init without plugins, the Python client, the deployment manifests, the fuzz run"
# The VM tests leave about 40% of the two cores idle (one guest at a time,
# mostly waiting for it): the steps that need neither the guest nor the
# VM tests' quiet run in that time, in a session of their own at the
# lowest CPU and I/O priority (as the release build above), each into a
# log of its own shown after the VM tests, in this order, as if it had
# run alone. The first of them to fail stops them; its log says why.
setsid bash -c 'echo 19 2>/dev/null >/proc/self/autogroup
    exec nice -n 19 ionice -c 3 scripts/test-beside-vm.sh "$0" "$1"' "$LOG.beside" "$FUZZ_SECONDS" &
beside_pid=$!
ALLOX_REQUIRE_PRIVILEGED=1 cargo test -p allox-integration --test vm --test powercut -- --test-threads=1 2>&1 | tee -a "$LOG"
beside_ok=1
wait "$beside_pid" || beside_ok=0
beside_pid=""
for part in again python manifests fuzz; do
    [ -f "$LOG.beside.$part" ] || continue
    case $part in
    again) step "the core's integration tests again, on allox-init without plugins (ran beside the VM tests)" ;;
    python) step "Python client (pytest against a real daemon and gateway; ran beside the VM tests)" ;;
    manifests) step "deployment manifests (kustomize output against the Kubernetes schemas, the deployment's rules; ran beside the VM tests)" ;;
    fuzz) step "fuzz targets: protocol decoding (host and guest; ran beside the VM tests)" ;;
    esac
    cat "$LOG.beside.$part"
    case $part in
    again) cat "$LOG.beside.$part" >>"$LOG" ;;
    python | manifests) py_passed=$((py_passed + $(grep -Eo '^[0-9]+ passed' "$LOG.beside.$part" | awk '{s += $1} END {print s + 0}'))) ;;
    esac
done
if [ "$beside_ok" = 0 ]; then
    echo "error: a step run beside the VM tests failed: $(cat "$LOG.beside.failed" 2>/dev/null || echo unknown)" >&2
    exit 1
fi

passed=$(grep -Eo '^test result: [a-z]+\. [0-9]+ passed' "$LOG" | awk -v py="$py_passed" '{s += $4} END {print s + py}')
failed=$(grep -Eo '; [0-9]+ failed' "$LOG" | awk '{s += $2} END {print s + 0}')
echo
echo "==> the 20 slowest tests"
python3 scripts/slowest-tests.py "$LOG" 20
took=$SECONDS
echo
echo "==> all tests passed"
echo "tests: $passed passed, $failed failed"
echo "time: $((took / 60)) min $((took % 60)) s, installs and the guest's kernel build included"
