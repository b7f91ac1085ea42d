#!/usr/bin/env bash
# cargo's runner for the test binaries of scripts/test.sh
# (CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER): runs each with libtest's
# time of every test (`--report-time`, "test NAME ... ok <1.234s>"), so the
# test command can list the slowest at its end. RUSTC_BOOTSTRAP is set for
# the test binary only, which reads it to take that flag; the build is not
# touched (cargo does not pass a runner's environment to rustc).
exe=$1
shift
exec env RUSTC_BOOTSTRAP=1 "$exe" "$@" -Z unstable-options --report-time
