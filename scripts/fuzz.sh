#!/usr/bin/env bash
# Builds the protocol fuzz targets (the host decoder, `decode`, and the
# guest interface's, `guest_decode`) and runs them for $1 seconds in all
# (default 60), shared between them. cargo-fuzz is installed from crates.io
# if missing; the stable toolchain is used with RUSTC_BOOTSTRAP for the
# sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")/.."
# The fuzz targets are compiled by rustc itself (scripts/test.sh lints its
# own builds through clippy-driver).
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
SECONDS_TO_RUN=${1:-60}
TARGETS=(decode guest_decode)
if ! cargo fuzz --help >/dev/null 2>&1; then
    echo "==> cargo install cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
for t in "${TARGETS[@]}"; do
    cargo fuzz build "$t"
done
if [ "$SECONDS_TO_RUN" -gt 0 ]; then
    # The host decoder keeps the larger share: its schema is the larger.
    guest=$((SECONDS_TO_RUN / 3))
    host=$((SECONDS_TO_RUN - guest))
    [ "$guest" -gt 0 ] || guest=1
    for run in "decode:$host" "guest_decode:$guest"; do
        t=${run%%:*}
        secs=${run##*:}
        [ "$secs" -gt 0 ] || continue
        echo "==> fuzz $t for ${secs}s"
        mkdir -p "fuzz/corpus/$t"
        cargo fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 20
    done
fi
