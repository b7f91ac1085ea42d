#!/usr/bin/env bash
# The container demo: Allox as a container, the way a Kata pod runs it
# (deploy/k8s), here under podman without a VM.
#
#   sudo scripts/demo-deploy.sh
#
# It builds the OCI image (rootfs-builder oci: reproducible, its digest
# printed), loads it into podman, runs it privileged on a blank loop device
# as /dev/allox-store (allox-init container formats it: --format-blank),
# drives it with alloxctl over the bind-mounted control socket, runs the
# gateway as a second, unprivileged container (uid 65532, read-only, no
# capabilities, its token from the environment) and calls it with curl;
# then stops it with `podman stop` (in order, exit 0), mounts the store on
# the host, and starts a new container on the same device, which sees it
# all. Everything is removed at the end.
#
# podman runs it with runc: Debian's crun 1.8 refuses a host whose cgroups
# are hybrid when the unified hierarchy offers any controller. On such a
# host the container gets a cgroup2 subtree of the host's (--cgroup-root);
# on a pure cgroup v2 host it uses its own cgroup (a leaf for itself, the
# controllers for its sessions).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
allox_need_root
allox_install_deps

TAG=localhost/allox:demo
SUP=allox-demo
GW=allox-demo-gw
PORT=${ALLOX_DEMO_PORT:-8093}
work=$(mktemp -d /var/tmp/allox-demo-deploy.XXXXXX)
dev=
cg=

cleanup() {
    podman rm -f -t 0 "$SUP" >/dev/null 2>&1 || true
    podman rm -f -t 0 "$GW" >/dev/null 2>&1 || true
    umount "$work/mnt" 2>/dev/null || true
    [ -n "$dev" ] && losetup -d "$dev" 2>/dev/null || true
    if [ -n "$cg" ] && [ -d "$cg" ]; then
        find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

say() { echo; echo "\$ alloxctl $*"; "$work/alloxctl" --socket "$work/run/ctl.sock" "$@"; }

allox_release_bins allox-init allox-observe allox-system-effects-verify allox-system-effects-recover alloxctl rootfs-builder
cp "$ALLOX_BIN_DIR/allox-init" "$ALLOX_BIN_DIR/allox-observe" \
    "$ALLOX_BIN_DIR/allox-system-effects-verify" "$ALLOX_BIN_DIR/allox-system-effects-recover" "$ALLOX_BIN_DIR/alloxctl" "$work/"

echo; echo "# the image: the guest's tree (with the system-effects observer allox-init pins), alloxctl, mkfs.btrfs; entrypoint allox-init container"
echo "\$ rootfs-builder oci --init allox-init --observer allox-observe --verifier allox-system-effects-verify --recover allox-system-effects-recover --alloxctl alloxctl --out oci --archive allox.tar --tag $TAG"
"$ALLOX_BIN_DIR/rootfs-builder" oci --init "$work/allox-init" --observer "$work/allox-observe" \
    --verifier "$work/allox-system-effects-verify" \
    --recover "$work/allox-system-effects-recover" \
    --alloxctl "$work/alloxctl" \
    --out "$work/oci" --archive "$work/allox.tar" --tag "$TAG" | sed 's/^/    /'
echo "\$ podman load -i allox.tar"
podman load -q -i "$work/allox.tar" | sed 's/^/    /'

# Limits podman may give a container here (its defaults can be above this
# session's, and the runtime may not raise them).
nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] || [ "$nofile" -gt 65536 ] && nofile=65536
nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ] && nproc=32768
run_opts=(--runtime runc --network host --ulimit "nofile=$nofile:$nofile" --ulimit "nproc=$nproc:$nproc")

truncate -s 2G "$work/store.img"
dev=$(losetup -f --show "$work/store.img")
mkdir -p "$work/run"
cgroup_opts=()
cgroup_args=()
if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ]; then
    cg=/sys/fs/cgroup/unified/allox-demo
    mkdir -p "$cg"
    cgroup_opts=(-v "$cg:/run/allox-cgroup")
    cgroup_args=(--cgroup-root /run/allox-cgroup)
    echo; echo "# this host's cgroups are hybrid: the container gets $cg as its cgroup root"
fi
tracker=()
[ -e /sys/kernel/btf/vmlinux ] && tracker=(--process-tracker ebpf)

echo; echo "# the supervisor's container: privileged (in a Kata pod: inside the VM only), the store at /dev/allox-store"
echo "\$ podman run -d --name $SUP --privileged -v $dev:/dev/allox-store -v RUN:/run/allox $TAG --store /dev/allox-store --format-blank --allow-uid 65532 ${tracker[*]}"
t0=$(date +%s%N)
podman run -d --name "$SUP" --privileged "${run_opts[@]}" \
    -v "$work/run:/run/allox" -v "$dev:/dev/allox-store" "${cgroup_opts[@]}" \
    "$TAG" --store /dev/allox-store --format-blank --stop-timeout 20 --allow-uid 65532 \
    "${cgroup_args[@]}" "${tracker[@]}" >/dev/null
for _ in $(seq 600); do
    "$work/alloxctl" --socket "$work/run/ctl.sock" ping >/dev/null 2>&1 && break
    sleep 0.05
done
echo "    (answering $(( ($(date +%s%N) - t0) / 1000000 )) ms after podman run, a blank device formatted on the way)"
podman logs "$SUP" 2>&1 | sed 's/^/    | /'

echo; echo "# agents and sessions, a sandboxed run, a checkpoint, a change, its diff, the rollback"
say agent create agent-a
say session create agent-a session-1
say exec agent-a session-1 -- sh -c 'echo "hello from a sandbox in a container" > hello.txt; cat hello.txt; id'
say checkpoint create agent-a session-1 clean --label "before the change"
say exec agent-a session-1 -- sh -c 'echo changed > hello.txt; echo scratch > notes.txt'
say diff agent-a session-1 clean current
say rollback agent-a session-1 clean
say exec agent-a session-1 -- ls
if [ "${#tracker[@]}" -gt 0 ]; then
    sleep 0.5
    say ps agent-a session-1 --tree
fi

echo; echo "# the gateway's container: uid 65532, read-only root, no capabilities, the token from its environment"
token=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
podman run -d --name "$GW" "${run_opts[@]}" --user 65532:65532 --read-only --cap-drop all \
    --security-opt no-new-privileges -v "$work/run:/run/allox" -e "ALLOX_GATEWAY_TOKEN=$token" \
    --entrypoint /usr/bin/alloxctl "$TAG" --socket /run/allox/ctl.sock \
    gateway --listen "127.0.0.1:$PORT" --token-env ALLOX_GATEWAY_TOKEN >/dev/null
for _ in $(seq 200); do
    curl -s -o /dev/null "http://127.0.0.1:$PORT/v1/openapi.json" && break
    sleep 0.05
done
rpc() {
    echo "\$ curl -sS http://127.0.0.1:$PORT/v1/rpc -H 'Authorization: Bearer …' -d '$1'"
    curl -sS "http://127.0.0.1:$PORT/v1/rpc" -H "Authorization: Bearer $token" \
        -H 'Content-Type: application/json' -d "$1"
    echo
}
rpc '{"action":"agent.create","params":{"agent_id":"agent-b"}}'
rpc '{"action":"session.create","params":{"agent_id":"agent-b","session_id":"session-1"}}'
rpc '{"action":"checkpoint.create","params":{"agent_id":"agent-b","session_id":"session-1","checkpoint_id":"clean"}}'
rpc '{"action":"session.rollback","params":{"agent_id":"agent-b","session_id":"session-1","checkpoint_id":"clean"}}'
echo "\$ curl … without the token"
curl -sS -o /dev/null -w '    HTTP %{http_code}\n' "http://127.0.0.1:$PORT/v1/rpc" \
    -H 'Content-Type: application/json' -d '{"action":"agent.list","params":{}}'
podman rm -f -t 0 "$GW" >/dev/null

echo; echo "# podman stop with a run still going: the sessions are killed, the store flushed and unmounted, exit 0"
"$work/alloxctl" --socket "$work/run/ctl.sock" start agent-a session-1 -- sleep 600 >/dev/null
t0=$(date +%s%N)
podman stop -t 30 "$SUP" >/dev/null
echo "\$ podman stop -t 30 $SUP    # $(( ($(date +%s%N) - t0) / 1000000 )) ms, exit status $(podman inspect "$SUP" --format '{{.State.ExitCode}}')"
podman logs "$SUP" 2>&1 | grep 'allox-init:' | tail -4 | sed 's/^/    | /'
podman rm "$SUP" >/dev/null

echo; echo "# the store on the host"
mkdir -p "$work/mnt"
mount "$dev" "$work/mnt"
echo "\$ ls $dev:/allox/agents/*/workspace/sessions/*"
(cd "$work/mnt/allox" && ls -d agents/*/workspace/sessions/*/checkpoints/* | sed 's/^/    /')
umount "$work/mnt"

echo; echo "# a new container on the same device (a rescheduled pod on its claim): everything is there"
podman run -d --name "$SUP" --privileged "${run_opts[@]}" \
    -v "$work/run:/run/allox" -v "$dev:/dev/allox-store" "${cgroup_opts[@]}" \
    "$TAG" --store /dev/allox-store "${cgroup_args[@]}" >/dev/null
for _ in $(seq 600); do
    "$work/alloxctl" --socket "$work/run/ctl.sock" ping >/dev/null 2>&1 && break
    sleep 0.05
done
say agent list
say checkpoint list agent-a session-1
say check
podman stop -t 30 "$SUP" >/dev/null
echo; echo "==> done: image $TAG, exit status $(podman inspect "$SUP" --format '{{.State.ExitCode}}') after the second stop"
