#!/usr/bin/env bash
# Builds everything the guest needs and prints where it is:
#   - the kernel (kernel/build.sh, cached outside the repo by config hash),
#   - a release allox-init, stripped (the static PID 1 and supervisor;
#     scripts/build-release.sh, its debug information kept beside it, or
#     the one in ALLOX_BIN_DIR), copied to target/guest/allox-init, and
#     the system-effects observer and verifier whose sha256 it pins,
#     copied to target/guest/allox-observe and
#     target/guest/allox-system-effects-verify,
#   - the initramfs of the default profile (rootfs-builder, reproducible),
#     with the observer as /allox-observe and the verifier as
#     /allox-system-effects-verify beside /init, and the scope file
#     /etc/allox/effects-scope.json (docs/guest.md: the plugin is enabled
#     with allox.args=--plugin=system-effects,...).
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
allox_release_bins allox-init allox-observe allox-system-effects-verify allox-system-effects-recover rootfs-builder
out=target/guest
mkdir -p "$out"
cp "$ALLOX_BIN_DIR/allox-init" "$ALLOX_BIN_DIR/allox-observe" \
    "$ALLOX_BIN_DIR/allox-system-effects-verify" "$ALLOX_BIN_DIR/allox-system-effects-recover" "$out/"
# The guest's supervisor runs the observer, the verifier and the recover tool only if
# allox-init pins their hashes: a mismatched set (ALLOX_BIN_DIR from
# elsewhere) stops here.
for b in allox-observe allox-system-effects-verify allox-system-effects-recover; do
    sha=$(sha256sum "$out/$b" | cut -d' ' -f1)
    grep -qF "$sha" "$out/allox-init" || {
        echo "error: $out/allox-init does not pin the sha256 of $out/$b ($sha); build them with scripts/build-release.sh" >&2
        exit 1
    }
done
"$ALLOX_BIN_DIR/rootfs-builder" initramfs \
    --init "$out/allox-init" --observer "$out/allox-observe" \
    --verifier "$out/allox-system-effects-verify" \
    --recover "$out/allox-system-effects-recover" \
    --out "$out/initrd.img" --compress gzip >&2
echo "ALLOX_KERNEL_DIR=$kdir"
echo "ALLOX_INITRD=$(pwd)/$out/initrd.img"
