#!/usr/bin/env bash
# Boots the Allox guest under QEMU.
#
#   scripts/run-vm.sh --initrd INITRD [options] [allox.KEY=VALUE ...] [-- QEMU ARGS]
#
# Options:
#   --initrd PATH        initramfs (required; env ALLOX_INITRD)
#   --kernel-dir DIR     kernel build output (env ALLOX_KERNEL_DIR; default:
#                        the cached build of kernel/build.sh, built if missing)
#   --store IMG          store disk image, attached as virtio-blk with serial
#                        "allox-store"
#   --ctl-socket PATH    host Unix socket of the control port
#                        (default /run/allox/vm-ctl.sock)
#   --append ARGS        extra kernel command line
#   --memory SIZE        guest memory (default 1024M)
#   --cpus N             vCPUs (default 2)
#   --console-log FILE   guest console to FILE instead of stdio
#   --machine microvm|pc microvm boots the PVH vmlinux (default); pc boots
#                        bzImage through SeaBIOS (slower, a fallback)
#   --accel auto|kvm|tcg auto (default): KVM when /dev/kvm can run an ordinary
#                        guest (CPU has vmx/svm, not PVM), else TCG
#   --net none|user      none (default): the guest has no network device;
#                        user: one virtio-net device on QEMU's user networking
#                        with restrict=on (the guest reaches nothing but the
#                        forwards below), configured by allox-init as
#                        10.0.2.15/24 via 10.0.2.2 (allox.net=); only the
#                        supervisor's namespace (its network broker) has it
#   --forward ADDR:PORT=HOSTPORT
#                        with --net user (repeatable): a TCP connection from
#                        the guest to ADDR:PORT (an address in 10.0.2.0/24)
#                        reaches 127.0.0.1:HOSTPORT on the host, and nothing
#                        else on the host is reachable
#   --dry-run            print the QEMU command line and exit
#
# Arguments of the form allox.KEY=VALUE are added to the kernel command
# line, where allox-init reads its settings. Anything after `--` goes to
# QEMU as is.
#
# The control port is a virtio-serial port named org.allox.ctl (in the guest:
# /sys/class/virtio-ports/vportNpM/name), backed by a Unix socket on the host
# that QEMU listens on. Until a host client connects to that socket, the
# guest's writes to the port block (non-blocking ones fail with EAGAIN).
# The guest powering off (or panicking: -no-reboot) ends QEMU.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

die() {
    echo "run-vm: error: $*" >&2
    exit 1
}
note() { echo "run-vm: $*" >&2; }

initrd=${ALLOX_INITRD:-}
kdir=${ALLOX_KERNEL_DIR:-}
store=
ctl_socket=/run/allox/vm-ctl.sock
append=
memory=1024M
cpus=2
console_log=
machine=microvm
accel=auto
dry_run=0
net=none
forwards=()
settings=()
qemu_extra=()

while [ $# -gt 0 ]; do
    case $1 in
    --initrd) initrd=${2:?}; shift 2 ;;
    --kernel-dir) kdir=${2:?}; shift 2 ;;
    --store) store=${2:?}; shift 2 ;;
    --ctl-socket) ctl_socket=${2:?}; shift 2 ;;
    --append) append=${2?}; shift 2 ;;
    --memory) memory=${2:?}; shift 2 ;;
    --cpus) cpus=${2:?}; shift 2 ;;
    --console-log) console_log=${2:?}; shift 2 ;;
    --machine) machine=${2:?}; shift 2 ;;
    --accel) accel=${2:?}; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --net) net=${2:?}; shift 2 ;;
    --forward) forwards+=("${2:?}"); shift 2 ;;
    --) shift; qemu_extra=("$@"); break ;;
    allox.*=*) settings+=("$1"); shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

[ -n "$initrd" ] || die "--initrd is required"
[ -f "$initrd" ] || die "initrd $initrd not found"
[ -z "$store" ] || [ -f "$store" ] || [ -b "$store" ] || die "store image $store not found"
case $machine in microvm | pc) ;; *) die "--machine must be microvm or pc" ;; esac
case $net in none | user) ;; *) die "--net must be none or user" ;; esac
[ "$net" = user ] || [ "${#forwards[@]}" = 0 ] || die "--forward needs --net user"
for f in "${forwards[@]}"; do
    [[ $f =~ ^10\.0\.2\.[0-9]{1,3}:[0-9]{1,5}=[0-9]{1,5}$ ]] ||
        die "--forward $f: expected ADDR:PORT=HOSTPORT with ADDR in 10.0.2.0/24"
done

if ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
    [ "$(id -u)" = 0 ] || die "qemu-system-x86_64 missing (apt-get install qemu-system-x86)"
    note "installing qemu-system-x86"
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
        --no-install-recommends qemu-system-x86 >&2
fi

if [ -z "$kdir" ]; then
    kdir=$("$repo/kernel/build.sh" | tail -1)
fi
case $machine in
microvm) kernel=$kdir/vmlinux ;; # PVH entry: no decompression, no firmware
pc) kernel=$kdir/bzImage ;;
esac
[ -f "$kernel" ] || die "kernel $kernel not found"

# KVM only where an ordinary guest can run: /dev/kvm alone is not enough,
# a PVM host (kvm_pvm) exposes /dev/kvm but only runs PVM guests, and an
# ordinary guest crashes there while QEMU hangs. So decide from the facts,
# never from a trial boot.
pick_accel() {
    accel=tcg
    if [ ! -e /dev/kvm ]; then
        accel_why="no /dev/kvm"
    elif [ -e /sys/module/kvm_pvm ]; then
        accel_why="/dev/kvm is PVM (kvm_pvm loaded), which cannot run this guest"
    elif ! grep -qwE 'vmx|svm' /proc/cpuinfo; then
        accel_why="/dev/kvm present but the CPU has no vmx/svm"
    else
        accel=kvm
        accel_why="/dev/kvm present, CPU has vmx/svm, not PVM"
    fi
}
case $accel in
auto) pick_accel ;;
kvm | tcg) accel_why="forced with --accel" ;;
*) die "--accel must be auto, kvm or tcg" ;;
esac
note "accelerator: $accel ($accel_why)"

cmdline="console=ttyS0 quiet panic=-1 rdinit=/init"
if [ "$accel" = tcg ]; then
    # TCG's TSC runs at the host's rate and is one clock for all vCPUs, but
    # the guest cannot know: its CPU model has no invariant-TSC flag (TCG
    # cannot offer one). Without these, early calibration against the PIT
    # now and then never finishes (tsc_early_khz), the kernel declares the
    # TSCs unsynchronised and falls back to the 4 ms jiffies clock
    # (tsc=reliable), and each secondary vCPU spends 0.2 s calibrating its
    # delay loop (lpj, per jiffy, so from the kernel's CONFIG_HZ).
    khz=$(awk -F: '/^cpu MHz/ { printf "%d", $2 * 1000; exit }' /proc/cpuinfo)
    hz=$(sed -n 's/^CONFIG_HZ=//p' "$kdir/config" 2>/dev/null || true)
    if [ -n "$khz" ] && [ "$khz" -gt 0 ]; then
        cmdline+=" tsc_early_khz=$khz tsc=reliable"
        [ -n "$hz" ] && cmdline+=" lpj=$((khz * 1000 / hz))"
    else
        note "warning: no 'cpu MHz' in /proc/cpuinfo; the guest may hang calibrating its TSC"
    fi
fi
if [ "$net" = user ] && [[ " ${settings[*]} " != *" allox.net="* ]]; then
    settings+=("allox.net=10.0.2.15/24,10.0.2.2")
fi
[ "${#settings[@]}" -gt 0 ] && cmdline+=" ${settings[*]}"
[ -n "$append" ] && cmdline+=" $append"

if [ "$accel" = kvm ]; then
    cpu=host
    accel_opt=kvm
else
    cpu=max
    accel_opt=tcg
fi

case $machine in
microvm)
    # acpi=on (QEMU's default, stated): the guest finds the virtio-mmio
    # devices in the DSDT, powers off through the GED sleep register and
    # reboots (panic=-1, then -no-reboot ends QEMU) through its reset
    # register.
    machine_opt=microvm,acpi=on,accel=$accel_opt
    virtio=device # virtio-mmio
    ;;
pc)
    machine_opt=pc,accel=$accel_opt
    virtio=pci
    ;;
esac

args=(
    -M "$machine_opt" -cpu "$cpu" -smp "$cpus" -m "$memory"
    -nodefaults -no-user-config -no-reboot -nic none -display none
    -kernel "$kernel" -initrd "$initrd" -append "$cmdline"
)
if [ -n "$console_log" ]; then
    args+=(-serial "file:$console_log" -monitor none)
else
    # mon:stdio: Ctrl-A X quits, Ctrl-A C reaches the QEMU monitor.
    args+=(-serial mon:stdio)
fi

mkdir -p "$(dirname "$ctl_socket")"
args+=(
    -chardev "socket,id=ctl,path=$ctl_socket,server=on,wait=off"
    -device "virtio-serial-$virtio,id=vser"
    -device "virtserialport,bus=vser.0,chardev=ctl,name=org.allox.ctl"
)
if [ -n "$store" ]; then
    args+=(
        -drive "file=$store,if=none,id=store,format=raw,cache=writeback,discard=unmap"
        -device "virtio-blk-$virtio,drive=store,serial=allox-store"
    )
fi
if [ "$net" = user ]; then
    # Each forward runs a relay per connection (QEMU's guestfwd cmd:, on a
    # socket pair) to the host's 127.0.0.1 only.
    netdev="user,id=up,net=10.0.2.0/24,host=10.0.2.2,restrict=on"
    if [ "${#forwards[@]}" -gt 0 ]; then
        fwd_dir=$(mktemp -d /tmp/allox-vm-forward.XXXXXX)
        for f in "${forwards[@]}"; do
            guest=${f%%=*} hostport=${f#*=}
            relay=$fwd_dir/${guest//[.:]/-}.sh
            cat >"$relay" <<EOS
#!/bin/sh
exec python3 -c '
import socket, sys, threading
s = socket.create_connection(("127.0.0.1", $hostport))
def up():
    while True:
        d = sys.stdin.buffer.read1(65536)
        if not d:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(d)
threading.Thread(target=up, daemon=True).start()
while True:
    d = s.recv(65536)
    if not d:
        break
    sys.stdout.buffer.write(d)
    sys.stdout.buffer.flush()
'
EOS
            chmod 755 "$relay"
            netdev+=",guestfwd=tcp:$guest-cmd:$relay"
        done
    fi
    args+=(-netdev "$netdev" -device "virtio-net-$virtio,netdev=up")
fi
args+=("${qemu_extra[@]}")

if [ "$dry_run" = 1 ]; then
    line=qemu-system-x86_64
    for a in "${args[@]}"; do
        case $a in
        *[!A-Za-z0-9_./:=,+@%-]*) line+=" '${a//\'/\'\\\'\'}'" ;;
        *) line+=" $a" ;;
        esac
    done
    echo "$line"
    exit 0
fi
note "machine $machine, kernel $kernel, control socket $ctl_socket"
exec qemu-system-x86_64 "${args[@]}"
