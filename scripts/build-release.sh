#!/usr/bin/env bash
# Builds the release binaries (allox-init, alloxctl, allox-dns-stub,
# rootfs-builder: static, see .cargo/config.toml) and strips them, keeping
# their debug information in files of their own:
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
# Progress and each binary's size, as built and stripped, go to stderr;
# the script fails if a stripped binary still carries .debug_info or its
# debug file lacks it. The one line on stdout is
#   ALLOX_BIN_DIR=<dir>
# so callers can `bins=$(scripts/build-release.sh) && eval "$bins"`.
# Nothing is redone for a binary whose stripped copy is newer than the
# build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
for tool in objcopy readelf; do
    command -v "$tool" >/dev/null || {
        echo "error: $0 needs $tool (apt-get install binutils)" >&2
        exit 1
    }
done

bins=(allox-init alloxctl allox-dns-stub rootfs-builder)
echo "==> cargo build --release (${bins[*]})" >&2
cargo build --release --quiet --bins \
    -p allox-init -p allox-ctl -p allox-network -p allox-rootfs-builder >&2

dist=$PWD/target/dist
mkdir -p "$dist/.partial"
# (grep reads all of readelf's output: with -q it could stop first, and
# pipefail would take readelf's SIGPIPE for "no".)
has_section() { readelf -S --wide "$1" | grep -F -- " $2 " >/dev/null; }
mb() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }

echo "==> stripped into $dist, debug information kept beside each (NAME.debug)" >&2
printf '%-16s %12s %12s %12s\n' binary "as built" stripped "NAME.debug" >&2
for b in "${bins[@]}"; do
    src=$ALLOX_RELEASE/$b
    out=$dist/$b
    if ! [ "$out" -nt "$src" ] || ! [ "$out.debug" -nt "$src" ]; then
        part=$dist/.partial
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
    printf '%-16s %12s %12s %12s\n' "$b" "$(mb "$src")" "$(mb "$out")" "$(mb "$out.debug")" >&2
done
rmdir "$dist/.partial" 2>/dev/null || true
echo "ALLOX_BIN_DIR=$dist"
