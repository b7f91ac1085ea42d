#!/usr/bin/env bash
# Builds the protocol fuzz target and runs it for $1 seconds (default 60).
# cargo-fuzz is installed from crates.io if missing; the stable toolchain
# is used with RUSTC_BOOTSTRAP for the sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
if ! cargo fuzz --help >/dev/null 2>&1; then
    echo "==> cargo install cargo-fuzz"
    cargo install cargo-fuzz --locked --quiet
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build decode
if [ "$SECONDS_TO_RUN" -gt 0 ]; then
    mkdir -p fuzz/corpus/decode
    cargo fuzz run decode fuzz/corpus/decode -- -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 -print_final_stats=1 2>&1 | tail -n 20
fi
