#!/usr/bin/env bash
# Builds everything the guest needs and prints where it is:
#   - the kernel (kernel/build.sh, cached outside the repo by config hash),
#   - a release allox-init, stripped (the static PID 1 and supervisor;
#     scripts/build-release.sh, its debug information kept beside it, or
#     the one in ALLOX_BIN_DIR), copied to target/guest/allox-init,
#   - the initramfs of the default profile (rootfs-builder, reproducible).
# The last two lines on stdout are
#   ALLOX_KERNEL_DIR=<dir with vmlinux and bzImage>
#   ALLOX_INITRD=<initramfs>
# so callers can `eval "$(scripts/build-guest.sh | tail -2)"`. Progress goes
# to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
allox_need_root
allox_install_deps
allox_install_guest_deps

kdir=$(kernel/build.sh | tail -1)
allox_release_bins allox-init rootfs-builder
out=target/guest
mkdir -p "$out"
cp "$ALLOX_BIN_DIR/allox-init" "$out/allox-init"
"$ALLOX_BIN_DIR/rootfs-builder" initramfs \
    --init "$out/allox-init" --out "$out/initrd.img" --compress gzip >&2
echo "ALLOX_KERNEL_DIR=$kdir"
echo "ALLOX_INITRD=$(pwd)/$out/initrd.img"
