# Sourced by scripts/demo.sh: the VM manager part of the demo.

# A guest as one directory under $2 (alloxctl vm), with an agent's run
# going on: paused (a caller who will not wait is told so), resumed,
# snapshotted, its power cut, restored (the run goes on, the clock is the
# host's), and cloned twice (each clone with its own random bytes).
# $1: alloxctl; $2: the VMs' directory; $3: the kernel build; $4: the
# initramfs.
allox_demo_vm_manager() {
    local ctl=$1 vms=$2 kdir=$3 initrd=$4
    say() { echo; echo "\$ alloxctl $*"; "$ctl" --vm-dir "$vms" "$@"; }
    echo; echo "# the VM manager: each guest one directory, its QEMU driven over QMP"
    say vm create demo --memory 512 --kernel-dir "$kdir" --initrd "$initrd"
    say vm start demo
    say --vm demo agent create agent-a
    say --vm demo session create agent-a session-1
    echo; echo "# an agent's run that counts, once a second, in its workspace"
    say --vm demo start agent-a session-1 -- sh -c 'i=0; while true; do i=$((i+1)); echo $i > counter; sleep 1; done'
    echo; echo "# paused: a caller that will not wait is told so at once (one that waits is answered after the resume)"
    say vm pause demo
    say --vm demo --if-running ping || true
    say vm resume demo
    echo; echo "# a snapshot (memory, devices and the store disk at one instant), then the power cut"
    say vm snapshot demo snap-1
    say --vm demo exec agent-a session-1 -- cat counter
    say vm kill demo
    echo; echo "# three seconds later, restored: the run goes on where it was, the guest's clock moved to the host's"
    sleep 3
    say vm restore demo snap-1
    say --vm demo ps agent-a session-1
    echo; echo "# the guest's clock against the host's, and two seconds on, the counter went on from where it was"
    say --vm demo exec agent-a session-1 -- date -u
    date -u
    sleep 2
    say --vm demo exec agent-a session-1 -- cat counter
    say --vm demo check
    echo; echo "# two clones of one snapshot: their own disks and control ports, and different random bytes"
    say vm clone demo snap-1 clone-1
    say vm clone demo snap-1 clone-2
    for v in clone-1 clone-2; do
        say --vm "$v" exec agent-a session-1 -- sh -c 'head -c 16 /dev/urandom | od -An -tx1'
    done
    say vm list
    for v in demo clone-1 clone-2; do
        say vm rm --force "$v"
    done
}

# Kills and removes every VM under $2 (a cleanup after a failure).
allox_demo_vm_manager_cleanup() {
    local ctl=$1 vms=$2 d
    for d in "$vms"/*/; do
        [ -d "$d" ] && "$ctl" --vm-dir "$vms" vm rm --force "$(basename "$d")" >/dev/null 2>&1
    done
    return 0
}
