#!/usr/bin/env bash
# The steps of scripts/test.sh that run beside its VM tests (which leave
# about 40% of the two cores idle), in this order, each into a log of its
# own: LOG.again, LOG.python, LOG.manifests, LOG.fuzz (LOG is $1). The
# first to fail stops the rest and names itself in LOG.failed; the exit
# status says whether all passed. $2: the fuzz run's seconds.
#
# The core's integration tests again on allox-init without plugins use
# the debug binaries, as the integration tests before them do: the
# release build's ALLOX_BIN_DIR, which the VM tests use, is not theirs.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$1
fuzz_seconds=$2
unset ALLOX_BIN_DIR
fail() {
    echo "$1" >"$log.failed"
    exit 1
}
# Each log ends with when its part began and ended (seconds since this
# script began), to show how it went beside the VM tests.
took() { echo "(from $1 s to $SECONDS s after the VM tests began)" >>"$2"; }

# Four long tests whose subject is no plugin's (thousands of runs and the
# supervisor's memory, files through the gateway's spool, the pruned diff
# against the full walk, 256 MiB of files in and out), and the two whose
# subject is the tests' own watchdog (a hung test, a daemon that does not
# stop: 17 s of waiting), ran before, on allox-init with every plugin;
# here they are skipped, each said by name.
again_skip=(
    thousands_of_finished_runs_keep_the_supervisor_small
    files_through_the_gateway_are_spooled_and_passed_to_the_daemon_where_they_can
    pruned_diff_matches_the_full_walk_across_rollbacks
    files_go_in_and_out_byte_for_byte_and_as_they_were_at_a_checkpoint
    a_hung_test_is_shown_and_aborts_its_binary
    a_daemon_that_does_not_stop_is_shown_killed_and_fails_its_test
)
skip_args=()
for t in "${again_skip[@]}"; do
    echo "SKIPPED on allox-init without plugins (it ran before, with every plugin): $t" >>"$log.again"
    skip_args+=(--skip "$t")
done
ALLOX_INIT_BIN=$PWD/target/no-plugins/allox-init ALLOX_REQUIRE_PRIVILEGED=1 cargo test -p allox-integration \
    --test store --test daemon --test process --test files --test fork --test turns --test diff --test pause \
    -- --test-threads=2 "${skip_args[@]}" >>"$log.again" 2>&1 ||
    fail "the core's integration tests again, on allox-init without plugins"
took 0 "$log.again"

t=$SECONDS
bash scripts/test-python.sh >"$log.python" 2>&1 || fail "the Python client's tests (scripts/test-python.sh)"
took "$t" "$log.python"
t=$SECONDS
bash scripts/test-manifests.sh >"$log.manifests" 2>&1 || fail "the deployment manifests' tests (scripts/test-manifests.sh)"
took "$t" "$log.manifests"
t=$SECONDS
env -u CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER scripts/fuzz.sh "$fuzz_seconds" >"$log.fuzz" 2>&1 ||
    fail "the fuzz run (scripts/fuzz.sh $fuzz_seconds)"
took "$t" "$log.fuzz"
