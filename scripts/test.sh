#!/usr/bin/env bash
# Runs every test: format and lint checks, unit tests (no privileges), the
# integration tests on real loop-backed Btrfs (root) — the container image
# under podman among them —, the Python client's and the deployment
# manifests' tests, the core's tests again on an allox-init built without
# plugins, the release binaries stripped (their sizes printed; built, and
# the fuzz targets after them, in the background at the lowest priority
# while the tests above run), the VM tests, and the protocol fuzz target
# for a bounded time. Installs what it needs. Ends with the 20 slowest
# tests and the time it took.
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

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p allox-init --no-default-features --all-targets --quiet -- -D warnings

step "build"
cargo build --workspace --quiet

step "allox-init without plugins (cargo build -p allox-init --no-default-features) into target/no-plugins"
# Its own copy: the tests build the default allox-init again where cargo
# puts it.
cargo build --quiet -p allox-init --no-default-features
mkdir -p target/no-plugins
cp "$ALLOX_DEBUG/allox-init" target/no-plugins/allox-init
cargo build --quiet -p allox-init -p allox-ctl -p allox-effects

LOG=$(mktemp)
RELEASE=$(mktemp)
release_pid=""
# A failed step leaves no release build running behind it.
trap '[ -z "$release_pid" ] || kill -- -"$release_pid" 2>/dev/null; rm -f "$LOG" "$LOG.py" "$RELEASE" "$RELEASE.err" "$RELEASE.fuzz"' EXIT

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

step "the core's integration tests again, on allox-init without plugins"
# Four long tests whose subject is no plugin's (thousands of runs and the
# supervisor's memory, files through the gateway's spool, the pruned diff
# against the full walk, 256 MiB of files in and out) ran above, on
# allox-init with every plugin; here they are skipped, each said by name.
again_skip=(
    thousands_of_finished_runs_keep_the_supervisor_small
    files_through_the_gateway_are_spooled_and_passed_to_the_daemon_where_they_can
    pruned_diff_matches_the_full_walk_across_rollbacks
    files_go_in_and_out_byte_for_byte_and_as_they_were_at_a_checkpoint
)
skip_args=()
for t in "${again_skip[@]}"; do
    echo "SKIPPED on allox-init without plugins (it ran above, with every plugin): $t" | tee -a "$LOG"
    skip_args+=(--skip "$t")
done
ALLOX_INIT_BIN=$PWD/target/no-plugins/allox-init ALLOX_REQUIRE_PRIVILEGED=1 cargo test -p allox-integration \
    --test store --test daemon --test process --test files --test fork --test turns --test diff --test pause \
    -- --test-threads=2 "${skip_args[@]}" 2>&1 | tee -a "$LOG"

step "Python client (pytest against a real daemon and gateway)"
bash scripts/test-python.sh 2>&1 | tee "$LOG.py"
# pytest's closing line: "N passed[, M skipped] in Xs" (a failure stops the
# script above through pipefail).
py_passed=$(grep -Eo '^[0-9]+ passed' "$LOG.py" | awk '{s += $1} END {print s + 0}')
rm -f "$LOG.py"

step "deployment manifests (kustomize output against the Kubernetes schemas, the deployment's rules)"
bash scripts/test-manifests.sh 2>&1 | tee "$LOG.py"
py_passed=$((py_passed + $(grep -Eo '^[0-9]+ passed' "$LOG.py" | awk '{s += $1} END {print s + 0}')))
rm -f "$LOG.py"

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

step "VM tests (QEMU; TCG unless the host has real KVM)"
ALLOX_REQUIRE_PRIVILEGED=1 cargo test -p allox-integration --test vm --test powercut -- --test-threads=1 2>&1 | tee -a "$LOG"

step "fuzz targets: protocol decoding (host and guest)"
env -u CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER scripts/fuzz.sh "$FUZZ_SECONDS"

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
