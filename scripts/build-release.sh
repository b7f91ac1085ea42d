#!/usr/bin/env bash
# Builds the release binaries (allox-observe, allox-system-effects-verify,
# allox-init, alloxctl,
# allox-dns-stub, rootfs-builder: static, see .cargo/config.toml) and strips
# them, keeping their debug information in files of their own:
#
#   target/dist/NAME         stripped, as `strip` does (no symbols, no
#                            debug information); what the images and the
#                            demos use
#   target/dist/NAME.debug   its symbols and debug information (line
#                            tables: the release profile's `debug = 1`;
#                            compressed), named in NAME's .gnu_debuglink,
#                            which gdb, addr2line, perf and a Rust
#                            backtrace (RUST_BACKTRACE=1) follow when it
#                            lies beside NAME or in /usr/lib/debug
#
# The system-effects observer and verifier come first: allox-init is then
# built with ALLOX_OBSERVE_SHA256 and ALLOX_VERIFY_SHA256 set to the
# sha256 of the stripped allox-observe and allox-system-effects-verify
# beside it (what the images carry; the supervisor runs each only if its
# bytes have that hash), and the script checks that allox-init holds both
# hashes. Cargo rebuilds allox-init whenever a hash changes (the variables
# are read by option_env!, which cargo tracks).
#
# ALLOX_PLUGINS chooses the supervisor's plugins built into allox-init
# (cargo features of allox-init): a comma-separated list of process-tree,
# network, share, monitor and system-effects, or "none"; every one by
# default. Without system-effects, allox-observe and the verifier are
# neither built nor pinned (and none is left in target/dist).
#
# Progress and each binary's size, as built and stripped, go to stderr;
# the script fails if a stripped binary still carries .debug_info or its
# debug file lacks it. The one line on stdout is
#   ALLOX_BIN_DIR=<dir>
# so callers can `bins=$(scripts/build-release.sh) && eval "$bins"`.
# Nothing is redone for a binary whose stripped copy is newer than the
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
# The release binaries are compiled by rustc itself, whatever compiler
# the caller's builds use (scripts/test.sh lints its debug builds through
# clippy-driver, which turns MIR optimizations off for its lints).
unset RUSTC_WORKSPACE_WRAPPER CLIPPY_ARGS
. scripts/deps.sh
for tool in objcopy readelf; do
    command -v "$tool" >/dev/null || {
        echo "error: $0 needs $tool (apt-get install binutils)" >&2
        exit 1
    }
done

dist=$PWD/target/dist
mkdir -p "$dist/.partial"
# (grep reads all of readelf's output: with -q it could stop first, and
# pipefail would take readelf's SIGPIPE for "no".)
has_section() { readelf -S --wide "$1" | grep -F -- " $2 " >/dev/null; }
mb() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }

# Strips $ALLOX_RELEASE/$1 into $dist/$1, its debug information into
# $dist/$1.debug, and checks both.
strip_into_dist() {
    local b=$1 src=$ALLOX_RELEASE/$1 out=$dist/$1 part=$dist/.partial
    if ! [ "$out" -nt "$src" ] || ! [ "$out.debug" -nt "$src" ]; then
        rm -f "$part/$b" "$part/$b.debug"
        objcopy --only-keep-debug --compress-debug-sections=zlib "$src" "$part/$b.debug"
        chmod 0644 "$part/$b.debug"
        # The link holds the debug file's base name and checksum: it is
        # made from the file with the name it keeps.
        objcopy --strip-all --add-gnu-debuglink="$part/$b.debug" "$src" "$part/$b"
        mv "$part/$b.debug" "$out.debug"
        mv "$part/$b" "$out"
    fi
    if has_section "$out" .debug_info; then
        echo "error: $out still carries .debug_info" >&2
        exit 1
    fi
    if has_section "$src" .debug_info && ! has_section "$out.debug" .debug_info; then
        echo "error: $out.debug lacks the .debug_info of $src" >&2
        exit 1
    fi
    if has_section "$src" .symtab && ! has_section "$out.debug" .symtab; then
        echo "error: $out.debug lacks the symbols of $src" >&2
        exit 1
    fi
    has_section "$out" .gnu_debuglink || {
        echo "error: $out does not name its debug file" >&2
        exit 1
    }
    sizes+=("$(printf '%-16s %12s %12s %12s' "$b" "$(mb "$src")" "$(mb "$out")" "$(mb "$out.debug")")")
}
sizes=()

plugins=${ALLOX_PLUGINS:-all}
init_features=()
effects=1
if [ "$plugins" != all ]; then
    init_features=(--no-default-features)
    features=()
    effects=""
    IFS=, read -ra wanted <<<"$plugins"
    for p in "${wanted[@]}"; do
        case $p in
        none) ;;
        process-tree | network | share | monitor) features+=("$p") ;;
        system-effects) features+=("$p"); effects=1 ;;
        *)
            echo "error: ALLOX_PLUGINS names $p; the plugins are process-tree, network, share, monitor, system-effects (or none)" >&2
            exit 1
            ;;
        esac
    done
    if [ "${#features[@]}" -gt 0 ]; then
        init_features+=(--features "$(IFS=,; echo "${features[*]}")")
    fi
fi

observe_sha256="" verify_sha256="" recover_sha256=""
if [ -n "$effects" ]; then
    echo "==> cargo build --release (allox-observe, allox-system-effects-verify, allox-system-effects-recover)" >&2
    cargo build --release --quiet -p allox-effects --bins >&2
    strip_into_dist allox-observe
    strip_into_dist allox-system-effects-verify
    strip_into_dist allox-system-effects-recover
    observe_sha256=$(sha256sum "$dist/allox-observe" | cut -d' ' -f1)
    verify_sha256=$(sha256sum "$dist/allox-system-effects-verify" | cut -d' ' -f1)
    recover_sha256=$(sha256sum "$dist/allox-system-effects-recover" | cut -d' ' -f1)
    echo "==> allox-observe sha256 $observe_sha256, allox-system-effects-verify sha256 $verify_sha256, allox-system-effects-recover sha256 $recover_sha256, pinned in allox-init" >&2
else
    rm -f "$dist"/allox-observe* "$dist"/allox-system-effects-verify* "$dist"/allox-system-effects-recover*
fi
export ALLOX_OBSERVE_SHA256=$observe_sha256 ALLOX_VERIFY_SHA256=$verify_sha256 ALLOX_RECOVER_SHA256=$recover_sha256

bins=(allox-init alloxctl allox-dns-stub rootfs-builder)
echo "==> cargo build --release (${bins[*]}; plugins: $plugins)" >&2
if [ "$plugins" = all ]; then
    cargo build --release --quiet --bins \
        -p allox-init -p allox-ctl -p allox-network -p allox-rootfs-builder >&2
else
    # allox-init alone, so that its features are its own.
    cargo build --release --quiet --bins -p allox-init "${init_features[@]}" >&2
    cargo build --release --quiet --bins -p allox-ctl -p allox-network -p allox-rootfs-builder >&2
fi
for b in "${bins[@]}"; do
    strip_into_dist "$b"
done
# The pin is a string in allox-init's read-only data: a stale build (the
# variable not seen) would lack it, or hold another.
if [ -n "$effects" ]; then
    grep -qF "$observe_sha256" "$dist/allox-init" || {
        echo "error: $dist/allox-init does not pin allox-observe's sha256 $observe_sha256" >&2
        exit 1
    }
    grep -qF "$verify_sha256" "$dist/allox-init" || {
        echo "error: $dist/allox-init does not pin allox-system-effects-verify's sha256 $verify_sha256" >&2
        exit 1
    }
    grep -qF "$recover_sha256" "$dist/allox-init" || {
        echo "error: $dist/allox-init does not pin allox-system-effects-recover's sha256 $recover_sha256" >&2
        exit 1
    }
fi

echo "==> stripped into $dist, debug information kept beside each (NAME.debug)" >&2
printf '%-16s %12s %12s %12s\n' binary "as built" stripped "NAME.debug" >&2
printf '%s\n' "${sizes[@]}" >&2
rmdir "$dist/.partial" 2>/dev/null || true
echo "ALLOX_BIN_DIR=$dist"
