#!/usr/bin/env bash
# The demo, in the guest: builds the guest kernel (cached), allox-init and
# the initramfs, boots the VM under QEMU (KVM where it really works, TCG
# otherwise), and drives agents, sessions, runs, checkpoints and rollbacks
# inside it with alloxctl over the virtio-serial control port; then shuts
# the VM down in order and checks the store on the host. Last, it boots the
# guest again with the system-effects plugin: the seed's command observed
# under protocol v2, a residue in shared/ with its verdict. Last, the VM
# manager (alloxctl vm): a guest paused, snapshotted, restored after a power
# cut and cloned twice with an agent's run going on.
#
#   sudo scripts/demo.sh
#
# scripts/demo-host.sh is the same walk-through against the supervisor as a
# plain daemon on a host Btrfs mount.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/demo-vm-manager.sh
allox_need_root
allox_install_deps
allox_install_guest_deps

echo "==> building the guest (kernel cached by config hash; the first build takes ~10 minutes)"
allox_release_bins allox-init alloxctl rootfs-builder
eval "$(scripts/build-guest.sh | tail -2)"
BIN=$ALLOX_BIN_DIR

WORK=$(mktemp -d /var/tmp/allox-demo-vm.XXXXXX)
# The guests are the VM manager's (alloxctl vm), one directory each.
export ALLOX_VM_DIR=$WORK/vms
export ALLOX_SOCKET=$ALLOX_VM_DIR/demo/ctl.sock
cleanup() {
    allox_demo_vm_manager_cleanup "$BIN/alloxctl" "$ALLOX_VM_DIR"
    allox_demo_vm_manager_cleanup "$BIN/alloxctl" "$WORK/vm-manager"
    [ -n "${GATEWAY:-}" ] && kill "$GATEWAY" 2>/dev/null && wait "$GATEWAY" 2>/dev/null || true
    [ -n "${INDEX:-}" ] && kill "$INDEX" 2>/dev/null && wait "$INDEX" 2>/dev/null || true
    umount "$WORK/mnt" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# The image of the python profile: the default one plus python3 and git,
# for the agents' programs (pip is fetched by the agent, below).
"$BIN/rootfs-builder" initramfs --init "$(dirname "$ALLOX_INITRD")/allox-init" \
    --observer "$(dirname "$ALLOX_INITRD")/allox-observe" \
    --verifier "$(dirname "$ALLOX_INITRD")/allox-system-effects-verify" \
    --recover "$(dirname "$ALLOX_INITRD")/allox-system-effects-recover" \
    --out "$WORK/initrd.img" --profile python --compress gzip

# For the session network's part: a Python package index on the host's
# loopback (one package, allox-demo, and pip itself as a wheel: the guest
# image has no pip), which the VM reaches at 10.0.2.100:80 through QEMU's
# restricted user networking, and nothing else.
allox_demo_index "$WORK/index"
PIP_WHEEL=$(ls /usr/share/python-wheels/pip-*.whl | head -1)
cp "$PIP_WHEEL" "$WORK/index/files/pip.whl"
IPORT=8094
python3 -m http.server "$IPORT" --bind 127.0.0.1 --directory "$WORK/index" >/dev/null 2>&1 &
INDEX=$!

vmctl() { echo "\$ alloxctl $*"; "$BIN/alloxctl" "$@"; }
vmctl vm create demo --kernel-dir "$ALLOX_KERNEL_DIR" --initrd "$WORK/initrd.img" \
    --memory 1024 --store-size 2048 --net-user --forward "10.0.2.100:80=$IPORT" \
    allox.args=--sandbox-network=isolated,--plugin=network,--share-tools,--plugin=monitor
vmctl vm start demo
echo "==> the guest's console:"
grep -E "allox-init|control port ready" "$ALLOX_VM_DIR/demo/console.log" | sed 's/^/    /'

ctl() { echo; echo "\$ alloxctl $*"; "$BIN/alloxctl" "$@"; }
in_vm() { local a=$1 s=$2; shift 2; echo; echo "\$ alloxctl exec $a $s -- sh -c '$*'"; "$BIN/alloxctl" exec "$a" "$s" -- sh -c "$*"; }

ctl ping
ctl info
ctl agent create agent-a
ctl agent create agent-b
ctl session create agent-a session-1
ctl session create agent-b session-1

echo; echo "# agent-a/session-1 writes its work inside its sandbox; agent-b works too"
in_vm agent-a session-1 'echo "print(\"hello\")" > main.py; echo "draft 1" > notes.txt; ls -l'
in_vm agent-b session-1 'echo "agent-b s file" > b.txt'
ctl checkpoint create agent-a session-1 clean --label "before the risky edit"

echo; echo "# the agent makes a mess"
in_vm agent-a session-1 'echo "rm -rf everything" > main.py; rm notes.txt; mkdir build; head -c 1048576 /dev/urandom > build/blob; ls -lR'
ctl checkpoint create agent-a session-1 messy
ctl diff agent-a session-1 clean messy
ctl rollback agent-a session-1 clean
in_vm agent-a session-1 'ls -l; cat main.py notes.txt'
echo; echo "# agent-b's session was not touched:"
in_vm agent-b session-1 'cat b.txt'

echo; echo "# new work after the rollback branches the checkpoint tree"
in_vm agent-a session-1 'echo "draft 2" > notes.txt'
ctl checkpoint create agent-a session-1 second-try
ctl log agent-a session-1

echo; echo "# the sandbox: its own files, no privilege, nothing else visible"
in_vm agent-a session-1 'pwd; id; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; ps -o pid,comm'

echo; echo "# a background process keeps running; rollback --kill-processes stops it first"
ctl start agent-a session-1 -- sh -c 'echo "server state" > server.log; exec sleep 3600'
sleep 0.5
ctl ps agent-a session-1
ctl rollback agent-a session-1 second-try --kill-processes
ctl ps agent-a session-1

echo; echo "# turns, with an automatic checkpoint for each good one"
ctl policy agent-b --auto-checkpoint on --keep-last 5
ctl session create agent-b session-2
ctl turn begin agent-b session-2
in_vm agent-b session-2 'echo "def parse(): pass" > parser.py'
ctl turn end agent-b session-2 turn-1 --label "wrote the parser"
ctl turn begin agent-b session-2
in_vm agent-b session-2 'rm parser.py; echo oops > broken.txt'
ctl turn end agent-b session-2 turn-2 --status failed
ctl log agent-b session-2
ctl diff agent-b session-2 turn-1 current --patch

echo; echo "# two runs of one session talk over the session's loopback (each session has a network namespace of its own)"
in_vm agent-b session-2 'mkdir -p www && echo "hello from a run of session-2" > www/index.html'
echo; echo "\$ alloxctl start agent-b session-2 -- httpd -f -p 127.0.0.1:8000 -h www"
"$BIN/alloxctl" start agent-b session-2 -- httpd -f -p 127.0.0.1:8000 -h www
in_vm agent-b session-2 'for i in $(seq 50); do wget -q -O - http://127.0.0.1:8000/index.html && exit 0; sleep 0.1; done; exit 1'
echo; echo "# another session cannot reach it"
in_vm agent-a session-1 'wget -O - http://127.0.0.1:8000/index.html' || true
ctl kill agent-b session-2
in_vm agent-b session-2 'rm -r www'

echo; echo "# a program inside the sandbox ends its own turn through the guest interface (/run/allox/guest.sock)"
ctl turn begin agent-b session-2
in_vm agent-b session-2 'allox whoami; echo "def parse(): return 1" > parser.py; allox turn end --label "ended from inside the sandbox"'
ctl log agent-b session-2

allox_demo_files_and_terminal "$WORK" "$BIN/alloxctl"
allox_demo_sharing "$BIN/alloxctl"

echo; echo "# the session network: a proxy-mode session reaches the network only through the broker,"
echo "# under its agent's egress rules (10.0.2.100 is the host's package index, forwarded by QEMU)"
ctl agent create agent-net --network proxy --allow 10.0.2.100:80
ctl session create agent-net session-1
in_vm agent-net session-1 'env | grep -E "^HTTPS?_PROXY="; \
    wget -q -O /tmp/pip.whl http://10.0.2.100/files/pip.whl && \
    python3 /tmp/pip.whl/pip install -q --no-cache-dir --disable-pip-version-check \
        --index-url http://10.0.2.100/simple/ --trusted-host 10.0.2.100 --target pkgs allox-demo && \
    PYTHONPATH=pkgs python3 -c "import allox_demo; print(\"allox_demo.VALUE =\", allox_demo.VALUE)"'
echo; echo "# a host the rules do not allow: refused before its name is even looked up"
in_vm agent-net session-1 'wget -q -O - http://example.com/' || true
echo; echo "# nor is there a way around the proxy"
in_vm agent-net session-1 'wget -q -Y off -O - http://10.0.2.100/' || true
ctl net audit agent-net session-1

echo; echo "# the JSON gateway on the host, in front of the VM's control port"
"$BIN/alloxctl" gateway --listen 127.0.0.1:8092 --token-file "$WORK/gateway.token" 2>>"$WORK/gateway.log" &
GATEWAY=$!
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8092/ && break; sleep 0.05; done
# QEMU's socket takes one host connection at a time: plain calls share
# the gateway's one daemon connection; a stream (its own connection) would
# wait for it, so the run's output comes with its answer here.
allox_demo_python "$WORK" http://127.0.0.1:8092 "$WORK/gateway.token" plain
kill "$GATEWAY"; wait "$GATEWAY" 2>/dev/null || true

ctl audit
ctl info
allox_demo_monitor "$WORK" "$BIN/alloxctl" "$PWD/target/demo-report.html"

echo; echo "# an orderly shutdown: sessions killed, store flushed and unmounted, power off"
vmctl vm stop demo
grep -E "allox-init: (shutting|store|powering)" "$ALLOX_VM_DIR/demo/console.log" | sed 's/^/    /'

echo; echo "# the store, mounted on the host afterwards"
mkdir -p "$WORK/mnt"
mount -o loop "$ALLOX_VM_DIR/demo/store.img" "$WORK/mnt"
ls "$WORK/mnt/allox/agents/agent-a/workspace/sessions/session-1/checkpoints"
umount "$WORK/mnt"

echo; echo "# system effects: the guest booted again with the plugin, on a new store. Each run is"
echo "# observed from its frozen start to its frozen end by the observer the image carries"
echo "# (/allox-observe, whose sha256 allox-init pins), with the BPF LSM in the guest's kernel"
echo "# and the image's scope (bpf, sysctl, mount, network, modules, processes); an observed"
echo "# run holds its session alone, which is why the demo above runs without it"
EFFECTS_ARGS=--plugin=system-effects,--system-effects-scope=/etc/allox/effects-scope.json
vmctl vm create effects --kernel-dir "$ALLOX_KERNEL_DIR" --initrd "$WORK/initrd.img" \
    --memory 1024 "allox.args=$EFFECTS_ARGS"
vmctl vm start effects
export ALLOX_SOCKET=$ALLOX_VM_DIR/effects/ctl.sock
last_run() { "$BIN/alloxctl" effects list "$1" "$2" | tail -1 | cut -d' ' -f1; }
ctl effects status
ctl agent create agent-a
ctl session create agent-a session-1
echo; echo "# the seed's command, under protocol v2: effect.txt in the workspace, nothing else"
in_vm agent-a session-1 'printf changed > effect.txt'
ctl effects get agent-a session-1 "$(last_run agent-a session-1)"
echo; echo "# the history's BPF LSM records of that run (file_open for write, path changes)"
echo "\$ alloxctl effects history agent-a session-1 $(last_run agent-a session-1) | grep -E 'open_write|unlink|mkdir|rename'"
"$BIN/alloxctl" effects history agent-a session-1 "$(last_run agent-a session-1)" |
    grep -E ' (open_write|unlink|mkdir|rmdir|rename) ' || true
echo; echo "# a run that leaves a residue in its agent's shared/ (outside the session, kept by rollback)"
in_vm agent-a session-1 'echo "left behind" > "$ALLOX_AGENT_SHARED/residue"'
ctl effects get agent-a session-1 "$(last_run agent-a session-1)"
RESIDUE=$(last_run agent-a session-1)
echo; echo "# its evidence checked by the verifier in the guest, then exported and checked again"
echo "# on the host by the same verifier built for the host: the same report"
ctl effects verify agent-a session-1 "$RESIDUE"
ctl effects export agent-a session-1 "$RESIDUE" -o "$WORK/residue-evidence.tar"
echo "\$ alloxctl effects verify --export residue-evidence.tar"
"$BIN/alloxctl" effects verify --export "$WORK/residue-evidence.tar" \
    --verifier "$(dirname "$ALLOX_INITRD")/allox-system-effects-verify"
echo; echo "# /bin/true: every observed domain CONSISTENT"
in_vm agent-a session-1 '/bin/true'
ctl effects get agent-a session-1 "$(last_run agent-a session-1)"
echo; echo "# protocol v3, the seed's example: process.start {recovery: {scrub_runtime: true,"
echo "# require_consistent: true}}. A baseline is made and pinned, the run observed (A, B), the"
echo "# workspace restored by the pinned recover tool, C captured: A→B and B→C CHANGED,"
echo "# A→C CONSISTENT, effect.txt gone, the session not fenced"
ctl exec agent-a session-1 --recover --scrub-runtime -- sh -c 'printf changed > effect-v3.txt'
in_vm agent-a session-1 'ls effect-v3.txt 2>&1 || true'
echo; echo "# a v3 run that writes shared/: rollback restores the workspace only, so A→C lists the"
echo "# residue and the session stays fenced; unfenced with the run's root"
ctl exec agent-a session-1 --recover -- sh -c 'echo v3 > "$ALLOX_AGENT_SHARED/v3-residue"' || true
V3=$(last_run agent-a session-1)
V3_ROOT=$("$BIN/alloxctl" effects list agent-a session-1 | tail -1 | awk '{print $NF}')
ctl effects status
ctl effects unfence agent-a session-1 "$V3" "$V3_ROOT"
echo; echo "# its evidence (recover, capture_c, recovery_verdict) verified in the guest, exported and"
echo "# verified on the host: the same report"
ctl effects verify agent-a session-1 "$V3" --root "$V3_ROOT"
ctl effects export agent-a session-1 "$V3" -o "$WORK/v3-evidence.tar"
echo "\$ alloxctl effects verify --export v3-evidence.tar --root $V3_ROOT"
"$BIN/alloxctl" effects verify --export "$WORK/v3-evidence.tar" --root "$V3_ROOT" \
    --verifier "$(dirname "$ALLOX_INITRD")/allox-system-effects-verify"
ctl effects list agent-a session-1
vmctl vm stop effects
vmctl vm rm effects

allox_demo_vm_manager "$BIN/alloxctl" "$WORK/vm-manager" "$ALLOX_KERNEL_DIR" "$ALLOX_INITRD"
echo
echo "==> demo done"
