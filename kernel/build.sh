#!/usr/bin/env bash
# Builds the Allox guest kernel from Debian's linux-source-6.1: `make
# tinyconfig`, the fragments in kernel/config/ merged on top, then bzImage
# (for `-M pc` and Kata) and vmlinux (PVH-bootable, for `-M microvm`).
#
# Results are cached outside the repository in
#   ${ALLOX_CACHE:-/var/cache/allox}/kernel/<key>/
# where <key> is the sha256 of the fragments, the linux-source package
# version and this script. A cache hit returns at once.
#
# The last line on stdout is the output directory; everything else goes to
# stderr, so other scripts can do `KDIR=$(kernel/build.sh | tail -1)`.
#
# Environment:
#   ALLOX_CACHE         cache root (default /var/cache/allox)
#   ALLOX_KERNEL_JOBS   parallel make jobs (default: nproc)
#   ALLOX_KERNEL_NICE   niceness of the build (default 10)
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
self="$here/$(basename "${BASH_SOURCE[0]}")"
cache=${ALLOX_CACHE:-/var/cache/allox}/kernel
jobs=${ALLOX_KERNEL_JOBS:-$(nproc)}
niceness=${ALLOX_KERNEL_NICE:-10}
src_pkg=linux-source-6.1
src_tar=/usr/src/$src_pkg.tar.xz
arch=x86_64

started=$SECONDS
elapsed() {
    local s=$((SECONDS - started))
    printf '%dm%02ds' $((s / 60)) $((s % 60))
}
log() { printf '[kernel %s] %s\n' "$(elapsed)" "$*" >&2; }
die() {
    log "error: $*"
    exit 1
}

install_deps() {
    local pkgs=("$src_pkg" build-essential bc bison flex libelf-dev libssl-dev
        dwarves cpio xz-utils kmod)
    local missing=() p
    for p in "${pkgs[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return
    [ "$(id -u)" = 0 ] || die "missing packages: ${missing[*]} (run as root or install them)"
    log "apt-get install ${missing[*]}"
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends "${missing[@]}" >&2
}

# Every CONFIG_ line of the fragments must be in the final .config exactly
# as written: tinyconfig + olddefconfig silently drop a symbol whose
# dependencies are off, so a missing dependency shows up here, by name.
verify_config() {
    local config=$1 frag line sym have bad=0
    shift
    for frag in "$@"; do
        while IFS= read -r line; do
            case $line in
            CONFIG_*=*) sym=${line%%=*} ;;
            "# CONFIG_"*" is not set")
                sym=${line#\# }
                sym=${sym%% *}
                ;;
            *) continue ;;
            esac
            have=$(grep -E "^($sym=|# $sym is not set)" "$config" || true)
            case $line in
            CONFIG_*) [ "$have" = "$line" ] && continue ;;
            *) case $have in "$sym="*) ;; *) continue ;; esac ;;
            esac
            log "config: ${frag##*/} wants '$line', got '${have:-<not offered: a dependency is off>}'"
            bad=1
        done <"$frag"
    done
    # One module only: the tests' dummy.ko (effects.config).
    if grep '=m$' "$config" | grep -qvx 'CONFIG_DUMMY=m'; then
        log "config: these are modules, which the guest never loads (only CONFIG_DUMMY=m, the tests' module, may be):"
        grep '=m$' "$config" | grep -vx 'CONFIG_DUMMY=m' >&2
        bad=1
    fi
    return "$bad"
}

# Runs make in the background and reports progress every 30 s: the number
# of kbuild steps done (for a build from scratch, out of the previous
# build from scratch's count) and the latest one.
make_with_progress() {
    local logf=$1 steps_file=$2 fresh=$3 total='' n last pid
    shift 3
    [ "$fresh" = 1 ] && total=$(cat "$steps_file" 2>/dev/null || true)
    "$@" >"$logf" 2>&1 &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        for _ in $(seq 30); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 1
        done
        kill -0 "$pid" 2>/dev/null || break
        n=$(grep -c '^  [A-Z]' "$logf" || true)
        last=$(grep '^  [A-Z]' "$logf" | tail -1 | tr -s ' ' || true)
        log "make: ${n}${total:+/~$total} steps,${last}"
    done
    if ! wait "$pid"; then
        grep -E -B2 -A8 'error|Error' "$logf" | tail -40 >&2 || tail -40 "$logf" >&2
        die "make failed; full log: $logf"
    fi
    if [ "$fresh" = 1 ]; then grep -c '^  [A-Z]' "$logf" >"$steps_file" || true; fi
}

install_deps
[ -f "$src_tar" ] || die "$src_tar not found (is $src_pkg installed?)"
src_ver=$(dpkg-query -W -f='${Version}' "$src_pkg")

fragments=("$here"/config/*.config)
[ -f "${fragments[0]}" ] || die "no config fragments in $here/config"
key=$({
    for f in "${fragments[@]}"; do
        printf '== %s\n' "${f##*/}"
        cat "$f"
    done
    printf '== %s %s\n== build.sh\n' "$src_pkg" "$src_ver"
    cat "$self"
} | sha256sum | cut -d' ' -f1)
out=$cache/$key

hit() {
    if [ -f "$out/bzImage" ] && [ -f "$out/vmlinux" ] && [ -f "$out/modules/dummy.ko" ]; then
        log "cache hit: $out"
        echo "$out"
        exit 0
    fi
}
hit

mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
    log "another kernel build holds $cache/.lock; waiting"
    flock 9
    hit
fi

log "building kernel $key ($src_pkg $src_ver, ${#fragments[@]} fragments, -j$jobs, nice $niceness)"

# The source tree is unpacked once per package version and built out of
# tree in one build dir per version, so a fragment edit rebuilds only what
# it touches. Trees of other versions are removed.
srcroot=$cache/src/$src_ver
ksrc=$srcroot/$src_pkg
obj=$cache/build/$src_ver
for d in "$cache"/src/* "$cache"/build/*; do
    [ -d "$d" ] || continue
    case $d in "$srcroot" | "$obj") ;; *)
        log "removing stale $d"
        rm -rf "$d"
        ;;
    esac
done
if [ ! -f "$srcroot/.unpacked" ]; then
    log "unpacking $src_tar"
    rm -rf "$srcroot"
    mkdir -p "$srcroot"
    tar -xf "$src_tar" -C "$srcroot"
    touch "$srcroot/.unpacked"
fi
mkdir -p "$obj"

kmake() {
    nice -n "$niceness" make -C "$ksrc" O="$obj" ARCH="$arch" -j"$jobs" \
        KBUILD_BUILD_USER=allox KBUILD_BUILD_HOST=allox \
        KBUILD_BUILD_TIMESTAMP="$src_pkg $src_ver" "$@"
}

logf=$obj/build.log
log "config: tinyconfig + ${fragments[*]##*/}"
{
    kmake tinyconfig
    (cd "$ksrc" && scripts/kconfig/merge_config.sh -m -O "$obj" "$obj/.config" "${fragments[@]}")
    kmake olddefconfig
} >"$obj/config.log" 2>&1 || {
    tail -30 "$obj/config.log" >&2
    die "configuration failed; full log: $obj/config.log"
}
verify_config "$obj/.config" "${fragments[@]}" ||
    die "requested symbols missing from .config (see above); full config: $obj/.config"
log "config: all $(cat "${fragments[@]}" | grep -cE '^(CONFIG_|# CONFIG_.* is not set)') requested settings hold"

log "make bzImage (vmlinux is built on the way); log: $logf"
fresh=1
[ -f "$obj/vmlinux" ] && fresh=0
make_with_progress "$logf" "$cache/build/.steps" "$fresh" kmake bzImage
log "make modules (the tests' dummy.ko)"
kmake modules >>"$logf" 2>&1 || {
    tail -40 "$logf" >&2
    die "make modules failed; full log: $logf"
}
[ -f "$obj/drivers/net/dummy.ko" ] || die "make modules made no drivers/net/dummy.ko"

vmlinux=$obj/vmlinux
bzimage=$obj/arch/x86/boot/bzImage
# (readelf's output is captured first: `readelf | grep -q` fails under
# pipefail when grep stops reading early.)
sections=$(readelf -S "$vmlinux")
grep -q ' \.BTF ' <<<"$sections" || die "vmlinux has no .BTF section"
# The PVH entry point is an ELF note (XEN_ELFNOTE_PHYS32_ENTRY, type 18).
notes=$(readelf -n "$vmlinux")
grep -qE '^ *Xen .*(\(0x00000012\)|PHYS32_ENTRY)' <<<"$notes" ||
    die "vmlinux has no PVH entry note, QEMU -M microvm cannot boot it"

tmp=$cache/.$key.tmp
rm -rf "$tmp"
mkdir -p "$tmp"
cp "$bzimage" "$vmlinux" "$obj/System.map" "$tmp/"
mkdir "$tmp/modules"
cp "$obj/drivers/net/dummy.ko" "$tmp/modules/"
cp "$obj/.config" "$tmp/config"
cp "$logf" "$tmp/build.log"
kmake -s kernelrelease >"$tmp/kernel.release" 2>/dev/null
{
    printf 'key=%s\n' "$key"
    printf 'source=%s %s\n' "$src_pkg" "$src_ver"
    printf 'release=%s\n' "$(cat "$tmp/kernel.release")"
    printf 'fragments=%s\n' "${fragments[*]##*/}"
    printf 'build_seconds=%s\n' "$((SECONDS - started))"
    printf 'bzImage_bytes=%s\n' "$(stat -c %s "$tmp/bzImage")"
    printf 'vmlinux_bytes=%s\n' "$(stat -c %s "$tmp/vmlinux")"
} >"$tmp/build-info"
rm -rf "$out"
mv "$tmp" "$out"

log "done: bzImage $(du -h "$out/bzImage" | cut -f1), vmlinux $(du -h "$out/vmlinux" | cut -f1)"
echo "$out"
