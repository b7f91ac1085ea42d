#!/usr/bin/env bash
# Installs what the project needs on a fresh Debian machine, as root.
# Sourced by the other scripts; safe to run again.
set -euo pipefail

# Where cargo puts release binaries (the target is fixed in
# .cargo/config.toml), relative to the repository's root.
ALLOX_RELEASE=target/x86_64-unknown-linux-gnu/release
ALLOX_DEBUG=target/x86_64-unknown-linux-gnu/debug

# Sets and exports ALLOX_BIN_DIR, a directory of the release binaries
# named in "$@": the one ALLOX_BIN_DIR already names (binaries built
# before, e.g. by scripts/build-release.sh or a CI job: each must be
# there), else target/dist, built and stripped by scripts/build-release.sh.
allox_release_bins() {
    if [ -n "${ALLOX_BIN_DIR:-}" ]; then
        ALLOX_BIN_DIR=$(cd "$ALLOX_BIN_DIR" && pwd)
        local b
        for b in "$@"; do
            if [ ! -x "$ALLOX_BIN_DIR/$b" ]; then
                echo "error: ALLOX_BIN_DIR=$ALLOX_BIN_DIR has no executable $b" >&2
                exit 1
            fi
        done
        echo "==> using the binaries in ALLOX_BIN_DIR=$ALLOX_BIN_DIR" >&2
    else
        # An assignment, so that a failed build stops the caller.
        local built
        built=$(scripts/build-release.sh)
        eval "$built"
    fi
    export ALLOX_BIN_DIR
}

allox_need_root() {
    if [ "$(id -u)" != 0 ]; then
        echo "error: $0 must run as root (it makes loop devices and Btrfs filesystems)" >&2
        exit 1
    fi
}

allox_install_deps() {
    # bubblewrap: the benchmark's baseline; python3: used by the sandbox
    # tests as a program that makes raw system calls; gcc, gdb, strace and
    # git: ordinary programs the sandbox tests run under the seccomp
    # filters; clang and libbpf-dev (bpf_helpers.h): the process tracker's
    # eBPF programs; python3-pip, openssh-server and openssh-client: clients
    # the network tests run through a session's proxy; tmux and vim-tiny:
    # the terminal tests drive a session's terminal from tmux as a person
    # would, and run vi in it; chromium: the monitor's report is rendered
    # headless and counted; python3-httpx, -pytest, -jsonschema, -venv,
    # -setuptools and -wheel: the Python client (clients/python), its tests
    # and its schema checks; python3-requests: a client the secrets tests
    # run through a session's proxy; podman, runc, skopeo, binutils (objcopy and
    # readelf: the release binaries stripped, scripts/build-release.sh) and
    # e2fsprogs: the container image is built, inspected and run under
    # podman (runc: this host's crun refuses its hybrid cgroups), with an
    # ext4 device among those it must refuse; busybox-static: the image's
    # tools (the guest's too); iproute2 and nftables: the system-effects
    # tests change a network namespace's links, routes, rules and tables;
    # prometheus: a real Prometheus scrapes the gateway's metrics; bpftool:
    # `bpftool prog`, a command the system-effects benchmark times its
    # captures against.
    local pkgs=(btrfs-progs curl util-linux mount bubblewrap python3 gcc gdb strace git
        clang libbpf-dev python3-pip openssh-server openssh-client tmux vim-tiny chromium
        python3-httpx python3-pytest python3-jsonschema python3-venv python3-setuptools python3-requests
        python3-wheel podman runc skopeo binutils e2fsprogs busybox-static iproute2 nftables prometheus bpftool)
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "==> apt-get install ${missing[*]}"
        apt-get update -qq
        # No service starts (openssh-server's sshd): the tests run their
        # own, on the loopback.
        local norc=""
        if [ ! -e /usr/sbin/policy-rc.d ]; then
            printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
            chmod 755 /usr/sbin/policy-rc.d
            norc=1
        fi
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        if [ -n "$norc" ]; then rm -f /usr/sbin/policy-rc.d; fi
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        if [ -x "$HOME/.cargo/bin/cargo" ]; then
            export PATH="$HOME/.cargo/bin:$PATH"
        else
            echo "==> no cargo found; installing Debian's Rust toolchain"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc >/dev/null
        fi
    fi
    modprobe btrfs 2>/dev/null || true
    modprobe loop 2>/dev/null || true
}

# What building and booting the guest needs on top: QEMU, a static busybox
# for the image, binutils (strip). The kernel's build dependencies are
# installed by kernel/build.sh.
allox_install_guest_deps() {
    # python3-pip-whl: pip as one wheel, which the VM demo's agent fetches
    # through the session's proxy and runs (the guest image has no pip).
    local pkgs=(qemu-system-x86 busybox-static binutils cpio python3-pip-whl)
    local missing=()
    for p in "${pkgs[@]}"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "==> apt-get install ${missing[*]}" >&2
        apt-get -o DPkg::Lock::Timeout=600 update -qq
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
            --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

# Makes a loop-backed Btrfs filesystem of $2 MiB mounted at $1.
allox_make_btrfs() {
    local mnt=$1 size_mb=$2
    local img="$mnt.img"
    mkdir -p "$mnt"
    truncate -s "${size_mb}M" "$img"
    mkfs.btrfs -q -f "$img" >/dev/null
    mount -o loop "$img" "$mnt"
}

allox_remove_btrfs() {
    local mnt=$1
    umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    rm -f "$mnt.img"
    rmdir "$mnt" 2>/dev/null || true
}

# A Python package index (PEP 503) in DIR with one package, allox-demo
# (module allox_demo, VALUE = 42): what the demos' agents install through
# the session network's proxy.
allox_demo_index() {
    local dir=$1
    mkdir -p "$dir/simple/allox-demo" "$dir/files"
    python3 - "$dir/files/allox_demo-1.0-py3-none-any.whl" <<'EOS'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1], "w")
z.writestr("allox_demo/__init__.py", "VALUE = 42\n")
z.writestr("allox_demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: allox-demo\nVersion: 1.0\n")
z.writestr("allox_demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: allox-demo\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
z.writestr("allox_demo-1.0.dist-info/RECORD", "")
z.close()
EOS
    echo '<a href="/files/allox_demo-1.0-py3-none-any.whl">allox_demo-1.0-py3-none-any.whl</a>' \
        >"$dir/simple/allox-demo/index.html"
}

# The demos' files-and-terminals part: a project copied into agent-a's
# session-1 (no process), a checkpoint, a fix made in vi on the session's
# own terminal through `alloxctl exec -t` (the keys typed by tmux, as a
# person would), the file read now and as it was at the checkpoint, and
# the project copied back out. $1: a scratch directory; $2: alloxctl (its
# socket in ALLOX_SOCKET).
allox_demo_files_and_terminal() {
    local work=$1 ctl=$2
    say() { echo; echo "\$ alloxctl $*"; "$ctl" "$@"; }
    echo; echo "# files without a process: a project copied in, changed, and read back as it was at a checkpoint"
    mkdir -p "$work/project/src"
    printf 'def answer():\n    return 41\n' >"$work/project/src/calc.py"
    printf '# a small project\n' >"$work/project/README.md"
    say cp "$work/project" agent-a/session-1:project
    say fs ls agent-a session-1 project --depth 3
    say checkpoint create agent-a session-1 before-fix
    echo; echo "# the fix, made interactively: vi on the session's own terminal through alloxctl exec -t"
    echo "# (a person's keys, typed here by tmux into a terminal alloxctl runs in)"
    local tm="$work/tmux.sock"
    echo; echo "\$ alloxctl exec -t agent-a session-1 -- vi project/src/calc.py"
    tmux -S "$tm" -f /dev/null new-session -d -x 80 -y 12 \
        "$ctl exec -t agent-a session-1 -- vi project/src/calc.py"
    screen() { tmux -S "$tm" capture-pane -p -t 0 2>/dev/null || true; }
    for _ in $(seq 300); do screen | grep -q 'return 41' && break; sleep 0.1; done
    # Line 2, its last character, replaced: keys any vi takes (the
    # guest's is busybox's).
    tmux -S "$tm" send-keys -t 0 2G '$' r2
    for _ in $(seq 300); do screen | grep -q 'return 42' && break; sleep 0.1; done
    screen | sed -e '/^~ *$/d' -e '/^$/d' -e 's/^/    | /'
    tmux -S "$tm" send-keys -t 0 ':wq' Enter
    for _ in $(seq 300); do tmux -S "$tm" has-session 2>/dev/null || break; sleep 0.1; done
    tmux -S "$tm" kill-server 2>/dev/null || true
    say fs cat agent-a session-1 project/src/calc.py
    say fs cat agent-a session-1 project/src/calc.py --checkpoint before-fix
    say cp agent-a/session-1:project "$work/project-back"
    echo; echo "\$ cat $work/project-back/src/calc.py"
    cat "$work/project-back/src/calc.py"
}

# Two agents share a report through the share plugin (the daemon runs
# with --share-tools): agent-b offers its output/ directory, agent-a (which
# shares too) reads the report by name, is refused a write while the share
# is read-only, and writes its review once agent-b allows writes.
allox_demo_sharing() {
    local ctl=$1
    say() { echo; echo "\$ alloxctl $*"; "$ctl" "$@"; }
    echo; echo "# sharing between sessions: off and read-only by default; both sides enable it, no key is handed out"
    say exec agent-b session-1 -- sh -c 'mkdir -p output && echo "3 tests fail in calc.py" > output/report.txt && allox share enable --scope output'
    say exec agent-a session-1 -- allox share enable
    say exec agent-a session-1 -- allox share read agent-b/session-1 report.txt
    say exec agent-a session-1 -- sh -c 'echo "fixed: calc.py returns 42" | allox share write agent-b/session-1 review.txt' || true
    say exec agent-b session-1 -- allox share enable --scope output --permission write
    say exec agent-a session-1 -- sh -c 'echo "fixed: calc.py returns 42" | allox share write agent-b/session-1 review.txt'
    say share list
    say fs cat agent-b session-1 output/review.txt
    say exec agent-b session-1 -- allox share disable
    say exec agent-a session-1 -- allox share read agent-b/session-1 report.txt || true
}

# The demos' last part: the monitor (the daemon runs with the monitor
# plugin on). One more turn of agent-b's session-2 as an agent framework
# traces it: an agent invocation, a model call with its tokens, a tool call
# whose run is started under it (--trace: the run sees TRACEPARENT and
# reports a step of its own from inside the sandbox), then the summary by
# tool and the session's report, one HTML page kept at $3.
# $1: a scratch directory; $2: alloxctl (its socket in ALLOX_SOCKET).
allox_demo_monitor() {
    local work=$1 ctl=$2 out=$3
    local trace=4bf92f3577b34da6a3ce929d0e0e4736
    echo; echo "# the monitor: a turn as the agent's framework traces it, its tool call's run under its span"
    echo; echo "\$ alloxctl turn begin agent-b session-2 --id check-parser"
    "$ctl" turn begin agent-b session-2 --id check-parser
    local t0 t1 t2 t3
    t0=$(date +%s%N)
    sleep 0.2 # the model call
    t1=$(date +%s%N)
    echo; echo "\$ alloxctl exec agent-b session-2 --trace $trace:a000000000000003 -- python3 -c …"
    "$ctl" exec agent-b session-2 --trace "$trace:a000000000000003" -- python3 -c '
import json, os, subprocess, time
t0 = time.time_ns()
compile(open("parser.py").read(), "parser.py", "exec")
_, trace, parent, _ = os.environ["TRACEPARENT"].split("-")
span = {"trace_id": trace, "span_id": "b000000000000001", "parent_span_id": parent,
        "name": "compile parser.py", "operation": "other",
        "start_unix_nano": t0, "end_unix_nano": time.time_ns()}
subprocess.run(["allox", "call", "monitor.spans", json.dumps({"spans": [span]})],
               check=True, stdout=subprocess.DEVNULL)
print("parser.py compiles; that step was sent as a span of trace", trace)'
    t2=$(date +%s%N)
    t3=$(date +%s%N)
    cat >"$work/spans.json" <<EOF
[{"trace_id": "$trace", "span_id": "a000000000000001", "name": "invoke_agent coder",
  "operation": "invoke_agent", "start_unix_nano": $t0, "end_unix_nano": $t3},
 {"trace_id": "$trace", "span_id": "a000000000000002", "parent_span_id": "a000000000000001",
  "name": "chat m-large", "operation": "chat", "model": "m-large",
  "input_tokens": 1200, "output_tokens": 300, "start_unix_nano": $t0, "end_unix_nano": $t1},
 {"trace_id": "$trace", "span_id": "a000000000000003", "parent_span_id": "a000000000000001",
  "name": "execute_tool check_parser", "operation": "execute_tool", "tool": "check_parser",
  "start_unix_nano": $t1, "end_unix_nano": $t2}]
EOF
    echo; echo "\$ alloxctl monitor ingest agent-b session-2 spans.json   # what the framework exports"
    "$ctl" monitor ingest agent-b session-2 "$work/spans.json"
    echo; echo "\$ alloxctl turn end agent-b session-2 check-parser"
    "$ctl" turn end agent-b session-2 check-parser
    echo; echo "\$ alloxctl monitor summary agent-b session-2 --by tool"
    "$ctl" monitor summary agent-b session-2 --by tool
    echo; echo "\$ alloxctl monitor report agent-b session-2 --out $out"
    "$ctl" monitor report agent-b session-2 --out "$out"
    echo "    (one page, nothing fetched: $(grep -o 'data-kind="turn"' "$out" | wc -l) turns," \
        "$(grep -o 'data-kind="span"' "$out" | wc -l) spans," \
        "$(grep -o 'data-kind="run-row"' "$out" | wc -l) runs on one axis; open it in a browser)"
}

# The demos' Python step: the client in clients/python installed into a
# fresh virtual environment ($1, a scratch directory) and an agent turn
# driven through the gateway at $2 (its token file $3), as a platform
# written in Python would: a session with automatic checkpoints, a turn,
# a command run (its output streamed as it is written unless $4 is
# "plain"), the turn's diff, a rollback.
allox_demo_python() {
    local work=$1 url=$2 token_file=$3 mode=${4:-stream}
    local venv="$work/python-client"
    /usr/bin/python3 -m venv --system-site-packages "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-build-isolation ./clients/python
    echo; echo "# the same from Python, through the gateway: clients/python (pip install ./clients/python)"
    cat >"$work/turn.py" <<'EOS'
import sys
import allox

url, token_file, mode = sys.argv[1:4]
with allox.Client(url, token_file=token_file) as c:
    c.agent_create("agent-py")
    c.session_create("agent-py", "s1", auto_checkpoint=True)     # takes the `baseline` checkpoint
    turn = c.turn_begin("agent-py", "s1")
    script = ["sh", "-c", "echo 'print(6 * 7)' > main.py; python3 main.py"]
    if mode == "stream":
        for ev in c.exec_stream("agent-py", "s1", script):
            if isinstance(ev, allox.Output):                     # as the run writes it
                print("    run says:", ev.text, end="")
    else:
        print("    run says:", c.exec("agent-py", "s1", script).stdout, end="")
    end = c.turn_end("agent-py", "s1", turn.turn_id, "ok", label="wrote main.py")
    print("    turn", end.turn_id, "checkpointed as", end.checkpoint_id)
    for change in c.diff("agent-py", "s1", "baseline", end.checkpoint_id).changes:
        print("    diff:", change.kind, change.path)
    c.rollback("agent-py", "s1", "baseline")
    try:
        c.call("fs.stat", agent_id="agent-py", session_id="s1", path="main.py")
    except allox.NotFound as e:
        print("    after the rollback:", e.code, "-", e.message)
EOS
    echo "\$ python3 turn.py $url"
    sed -n '5,27p' "$work/turn.py" | sed -e 's/^/    | /'
    "$venv/bin/python" "$work/turn.py" "$url" "$token_file" "$mode"
}
