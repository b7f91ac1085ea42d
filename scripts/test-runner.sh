#!/usr/bin/env bash
# cargo's runner for the test binaries of scripts/test.sh
# (CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER): runs each with libtest's
# time of every test (`--report-time`, "test NAME ... ok <1.234s>"), so the
# test command can list the slowest at its end. RUSTC_BOOTSTRAP is set for
# the test binary only, which reads it to take that flag; the build is not
# touched (cargo does not pass a runner's environment to rustc).
# The tests' own cargo builds (allox_integration::cargo_command) drop it
# again when it is the runner's, named by ALLOX_TEST_RUNNER_BOOTSTRAP:
# a build that saw it would rebuild what reads it, twice.
exe=$1
shift
if [ -z "${RUSTC_BOOTSTRAP+set}" ]; then
    export ALLOX_TEST_RUNNER_BOOTSTRAP=1
fi
exec env RUSTC_BOOTSTRAP=1 "$exe" "$@" -Z unstable-options --report-time
