#!/usr/bin/env bash
# Benchmarks checkpoint/rollback latency, the RPC round trip, spawning,
# turns and diff, and the guest's boot; prints
# Markdown tables (recorded in docs/benchmarks.md).
#   sudo scripts/bench.sh               # full run
#   ALLOX_BENCH_QUICK=1 scripts/bench.sh  # few iterations
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
allox_need_root
allox_install_deps
cargo build --release --quiet -p allox-init -p allox-ctl -p allox-integration
# The guest boot benchmark needs the guest image (kernel cached).
allox_install_guest_deps
eval "$(scripts/build-guest.sh | tail -2)"
export ALLOX_KERNEL_DIR ALLOX_INITRD
exec $ALLOX_RELEASE/allox-bench
