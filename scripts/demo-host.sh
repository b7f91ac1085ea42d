#!/usr/bin/env bash
# The demo without a VM: the supervisor as a daemon on a Btrfs store, and agent → session →
# checkpoint → change → rollback, showing what happens at each step.
#
#   sudo scripts/demo-host.sh         # makes a 1 GiB loop-backed Btrfs store
#   sudo scripts/demo-host.sh /mnt/btrfs   # uses a directory on an existing Btrfs
#
# The binaries are built (release, stripped: scripts/build-release.sh)
# unless ALLOX_BIN_DIR names a directory that has allox-init, alloxctl and
# allox-dns-stub already:
#   sudo ALLOX_BIN_DIR=target/dist scripts/demo-host.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/demo-secrets-ports.sh
allox_need_root
allox_install_deps

allox_release_bins allox-init alloxctl allox-dns-stub
BIN=$ALLOX_BIN_DIR

WORK=$(mktemp -d /var/tmp/allox-demo.XXXXXX)
MADE_FS=""
if [ $# -ge 1 ]; then
    ROOT=$1/allox-demo-store
    mkdir -p "$ROOT"
else
    MADE_FS=$WORK/btrfs
    allox_make_btrfs "$MADE_FS" 1024
    ROOT=$MADE_FS/store
    mkdir -p "$ROOT"
    echo "==> made a loop-backed Btrfs filesystem at $MADE_FS"
fi
export ALLOX_SOCKET=$WORK/ctl.sock
# The demo's sessions get a cgroup subtree of their own, removed at the end.
if [ -f /sys/fs/cgroup/cgroup.subtree_control ]; then CG=/sys/fs/cgroup; else CG=/sys/fs/cgroup/unified; fi
CGROOT=$CG/allox-demo-$$
mkdir -p "$CGROOT"

cleanup() {
    [ -n "${DAEMON:-}" ] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null || true
    [ -n "${DNS:-}" ] && kill "$DNS" 2>/dev/null && wait "$DNS" 2>/dev/null || true
    [ -n "${INDEX:-}" ] && kill "$INDEX" 2>/dev/null && wait "$INDEX" 2>/dev/null || true
    [ -n "${GATEWAY:-}" ] && kill "$GATEWAY" 2>/dev/null && wait "$GATEWAY" 2>/dev/null || true
    [ -n "${PROM:-}" ] && kill "$PROM" 2>/dev/null && wait "$PROM" 2>/dev/null || true
    [ -n "${MODEL:-}" ] && kill "$MODEL" 2>/dev/null && wait "$MODEL" 2>/dev/null || true
    if [ -d "$CGROOT" ]; then
        echo 1 >"$CGROOT/cgroup.kill" 2>/dev/null || true
        sleep 0.2
        find "$CGROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    fi
    [ -n "$MADE_FS" ] && allox_remove_btrfs "$MADE_FS"
    rm -rf "$WORK"
}
trap cleanup EXIT

# For the session network's part: a Python package index on this
# machine's loopback (one package, allox-demo), and a DNS stub that answers
# pypi.test with 127.0.0.1, for the broker to ask instead of the system's
# resolver. Nothing leaves the machine.
allox_demo_index "$WORK/index"
IPORT=8093
python3 -m http.server "$IPORT" --bind 127.0.0.1 --directory "$WORK/index" >/dev/null 2>&1 &
INDEX=$!
"$BIN/allox-dns-stub" pypi.test=127.0.0.1 model.test=127.0.0.1 >"$WORK/dns.addr" &
DNS=$!
for _ in $(seq 100); do [ -s "$WORK/dns.addr" ] && break; sleep 0.05; done

"$BIN/allox-init" supervise --root "$ROOT" --listen "unix:$ALLOX_SOCKET" \
    --sandbox-stage "$WORK/stage" --cgroup-root "$CGROOT" --sandbox-network isolated \
    --plugin network --share-tools --network-resolver "$(cat "$WORK/dns.addr")" \
    --monitor-root "$WORK/monitor" --secrets-key-file "$WORK/secrets.key" \
    2>"$WORK/daemon.log" &
DAEMON=$!
for _ in $(seq 100); do [ -S "$ALLOX_SOCKET" ] && break; sleep 0.05; done
ctl() { echo; echo "\$ alloxctl $*"; "$BIN/alloxctl" "$@"; }
show() { echo; echo "\$ $*"; "$@"; }

ctl ping
ctl plugins
ctl agent create agent-a
ctl agent create agent-b
ctl session create agent-a session-1
ctl session create agent-b session-1
CUR=$ROOT/agents/agent-a/workspace/sessions/session-1/current
OTHER=$ROOT/agents/agent-b/workspace/sessions/session-1/current

echo; echo "# agent-a/session-1 writes its work; agent-b works too"
echo "print('hello')" >"$CUR/main.py"
echo "draft 1" >"$CUR/notes.txt"
echo "agent-b's file" >"$OTHER/b.txt"
show ls -l "$CUR"

ctl checkpoint create agent-a session-1 clean --label "before the risky edit"

echo; echo "# the agent makes a mess"
echo "rm -rf everything" >"$CUR/main.py"
rm "$CUR/notes.txt"
mkdir -p "$CUR/build" && head -c 1048576 /dev/urandom >"$CUR/build/blob"
show ls -lR "$CUR"

ctl checkpoint create agent-a session-1 messy
ctl rollback agent-a session-1 clean
show ls -l "$CUR"
show cat "$CUR/main.py" "$CUR/notes.txt"
echo; echo "# agent-b's session was not touched:"
show cat "$OTHER/b.txt"

echo; echo "# new work after the rollback branches the checkpoint tree"
echo "draft 2" >"$CUR/notes.txt"
ctl checkpoint create agent-a session-1 second-try
ctl checkpoint list agent-a session-1

echo; echo "# fork the session into two approaches from one checkpoint, run each, roll one back"
ctl session fork agent-a session-1 approach-a --from second-try --label "try sed"
ctl session fork agent-a session-1 approach-b --from second-try --label "try a rewrite"
ctl exec agent-a approach-a -- sh -c 'sed -i "s/draft 2/draft 2, edited in place/" notes.txt; cat notes.txt'
ctl exec agent-a approach-b -- sh -c 'echo "a rewrite" > new.txt; mv new.txt notes.txt; cat notes.txt'
ctl rollback agent-a approach-b fork
ctl exec agent-a approach-b -- cat notes.txt
ctl log agent-a approach-a
echo; echo "# pause a session with a program in it; the next command resumes it"
ctl start agent-a approach-a -- sh -c 'while :; do date +%s >> ticks; sleep 0.2; done'
sleep 0.5
ctl session pause agent-a approach-a
ctl session info agent-a approach-a
ctl exec agent-a approach-a -- sh -c 'wc -l < ticks'
ctl session delete agent-a approach-a --force
ctl session delete agent-a approach-b

echo; echo "# commands run in the session's sandbox: its own files, no privilege, nothing else visible"
ctl exec agent-a session-1 -- sh -c 'pwd; ls; id; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; ls /allox; ps -e -o pid,comm | head'

echo; echo "# a background process changes the workspace and keeps running"
ctl checkpoint create agent-a session-1 before-server
ctl start agent-a session-1 -- sh -c 'echo "server state" > server.log; exec sleep 3600'
sleep 0.5
ctl ps agent-a session-1
echo; echo "# rollback refuses while the session has live processes..."
ctl rollback agent-a session-1 before-server || true
echo; echo "# ...and with --kill-processes kills them first (only this session's)"
ctl rollback agent-a session-1 before-server --kill-processes
ctl ps agent-a session-1
show ls "$CUR"

echo; echo "# an agent framework reports turns; with auto-checkpoints on, each good turn is kept"
ctl policy agent-b --auto-checkpoint on --keep-last 5
ctl session create agent-b session-2
ctl turn begin agent-b session-2
"$BIN/alloxctl" exec agent-b session-2 -- sh -c 'echo "def parse(): pass" > parser.py'
ctl turn end agent-b session-2 turn-1 --label "wrote the parser"
ctl turn begin agent-b session-2
"$BIN/alloxctl" exec agent-b session-2 -- sh -c 'rm parser.py; echo oops > broken.txt'
ctl turn end agent-b session-2 turn-2 --status failed
ctl log agent-b session-2
ctl diff agent-b session-2 turn-1 current --patch

echo; echo "# the same through the JSON gateway, as an agent framework would call it"
"$BIN/alloxctl" gateway --listen 127.0.0.1:8092 --metrics-listen 127.0.0.1:9464 2>>"$WORK/daemon.log" &
GATEWAY=$!
for _ in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8092/ && break; sleep 0.05; done
# The gateway serves only clients that send its token (made on first start,
# mode 0600, beside the socket); `alloxctl token` prints it.
TOKEN=$("$BIN/alloxctl" token)
gw() {
    echo; echo "\$ curl -sS http://127.0.0.1:8092/v1/rpc -H \"Authorization: Bearer \$(alloxctl token)\" -H 'Content-Type: application/json' -d '$1'"
    curl -sS http://127.0.0.1:8092/v1/rpc -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' -d "$1"; echo
}
gw '{"action":"session.create","params":{"agent_id":"agent-a","session_id":"session-2"}}'
echo; echo "# without the token: refused"
echo "\$ curl -sS http://127.0.0.1:8092/v1/rpc -H 'Content-Type: application/json' -d '{\"action\":\"agent.list\",\"params\":{}}'"
curl -sS http://127.0.0.1:8092/v1/rpc -H 'Content-Type: application/json' -d '{"action":"agent.list","params":{}}'; echo
gw '{"action":"checkpoint.create","params":{"agent_id":"agent-a","session_id":"session-2","checkpoint_id":"clean"}}'
gw '{"action":"session.rollback","params":{"agent_id":"agent-a","session_id":"session-2","checkpoint_id":"clean"}}'
gw '{"action":"session.rollback","params":{"agent_id":"agent-a","session_id":"session-2","checkpoint_id":"no-such"}}'
echo; echo "# a run's output as it is written: NDJSON lines, then the answer"
echo "\$ curl -sS -N http://127.0.0.1:8092/v1/rpc/process.start -H 'Accept: application/x-ndjson' ... -d '{\"agent_id\":\"agent-a\",\"session_id\":\"session-2\",\"argv\":[\"sh\",\"-c\",\"echo one; sleep 1; echo two\"],\"wait\":true,\"stream\":true}'"
curl -sS -N http://127.0.0.1:8092/v1/rpc/process.start -H "Authorization: Bearer $TOKEN" \
    -H 'Content-Type: application/json' -H 'Accept: application/x-ndjson' \
    -d '{"agent_id":"agent-a","session_id":"session-2","argv":["sh","-c","echo one; sleep 1; echo two"],"wait":true,"stream":true}' |
    cut -c1-160 | sed 's/^/    /'
allox_demo_python "$WORK" http://127.0.0.1:8092 "$WORK/gateway.token"

echo; echo "# two runs of one session talk over the session's loopback (each session has a network namespace of its own)"
ctl start agent-a session-1 -- python3 -m http.server 8000 --bind 127.0.0.1
for _ in $(seq 50); do
    "$BIN/alloxctl" exec agent-a session-1 -- python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000), 1)' 2>/dev/null && break
    sleep 0.1
done
ctl exec agent-a session-1 -- python3 -c 'import urllib.request; print(urllib.request.urlopen("http://127.0.0.1:8000/main.py").read().decode())'
echo; echo "# another session cannot reach it"
ctl exec agent-b session-1 -- python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000), 1)' || true
ctl kill agent-a session-1

echo; echo "# a program inside the sandbox ends its own turn through the guest interface (/run/allox/guest.sock)"
ctl turn begin agent-b session-2
ctl exec agent-b session-2 -- sh -c 'allox whoami; echo "def parse(): return 1" > parser.py; allox turn end --label "ended from inside the sandbox"'
ctl log agent-b session-2

allox_demo_files_and_terminal "$WORK" "$BIN/alloxctl"
allox_demo_sharing "$BIN/alloxctl"

echo; echo "# the session network: a proxy-mode session reaches the network only through the broker,"
echo "# under its agent's egress rules (pypi.test is this machine's package index)"
ctl agent create agent-net --network proxy --allow pypi.test --allow "127.0.0.1:$IPORT"
ctl session create agent-net session-1
ctl exec agent-net session-1 -- sh -c "env | grep -E '^HTTPS?_PROXY='; \
    python3 -m pip install -q --no-cache-dir --index-url http://pypi.test:$IPORT/simple/ \
        --trusted-host pypi.test --target pkgs allox-demo && \
    PYTHONPATH=pkgs python3 -c 'import allox_demo; print(\"allox_demo.VALUE =\", allox_demo.VALUE)'"
echo; echo "# a host the rules do not allow: refused before its name is even looked up"
ctl exec agent-net session-1 -- curl -sS http://example.com/ || true
echo; echo "# nor is there a way around the proxy: the session has a loopback and nothing else"
ctl exec agent-net session-1 -- curl -sS --noproxy '*' --max-time 3 "http://127.0.0.1:$IPORT/" || true
ctl net policy agent-net session-1
ctl net audit agent-net session-1

allox_demo_secrets_and_ports "$BIN/alloxctl" 127.0.0.1:8092 "$TOKEN" "$WORK" \
    "$PWD/target/demo-host-port.png" 8094 "$IPORT"

ctl audit

echo; echo "# the daemon's metrics, scraped by a real Prometheus (on 127.0.0.1, every second) from the gateway's metrics address"
cat >"$WORK/prometheus.yml" <<EOC
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: allox
    static_configs:
      - targets: ['127.0.0.1:9464']
EOC
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prometheus" \
    --web.listen-address=127.0.0.1:9091 >/dev/null 2>&1 &
PROM=$!
promql() {
    curl -sS -G http://127.0.0.1:9091/api/v1/query --data-urlencode "query=$1" |
        python3 -c 'import json, sys
for r in json.load(sys.stdin)["data"]["result"]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()) if k not in ("job", "instance", "__name__"))
    print("    {" + labels + "} " + r["value"][1])'
}
# Until Prometheus has scraped the daemon once.
for _ in $(seq 300); do
    [ "$(curl -sS -G http://127.0.0.1:9091/api/v1/query --data-urlencode 'query=up{job="allox"}' 2>/dev/null |
        python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else "")' 2>/dev/null)" = 1 ] && break
    sleep 0.1
done
for q in 'sum by (state) (allox_sessions)' \
    'allox_requests_total{action="session.rollback"}' \
    'allox_store_operation_duration_seconds_count' \
    'sum by (how) (allox_runs_ended_total)' \
    'allox_network_connections_total' \
    'allox_store_filesystem_bytes'; do
    echo "\$ promql '$q'"
    promql "$q"
done
allox_demo_monitor "$WORK" "$BIN/alloxctl" "$PWD/target/demo-host-report.html"
echo
echo "==> demo done (store was $ROOT)"
