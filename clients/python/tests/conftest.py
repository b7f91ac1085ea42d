"""Fixtures: a real daemon on a real loop-backed Btrfs, and the gateway in
front of it.

``gateway`` (once per test run) makes a sparse image, ``mkfs.btrfs -q``,
``mount -o loop``; starts ``$ALLOX_INIT supervise --root MNT/allox --listen
unix:SOCK`` (under a cgroup of its own below the cgroup2 mount) and
``$ALLOXCTL gateway --listen 127.0.0.1:0 --token-file FILE`` with
``ALLOX_SOCKET``; waits for both and yields ``(base_url, token)``. At the
end it stops both, kills what the sessions left, unmounts and deletes
everything.

Nothing is skipped: without root, loop devices, Btrfs, a cgroup2 mount, or
with ``ALLOX_INIT``/``ALLOXCTL`` unset or wrong, every test that needs the
gateway fails with a message naming what is missing. (The unit tests in
test_unit.py need none of it.)

``ALLOX_DAEMON_ARGS`` adds arguments to the daemon (shell syntax), and
``ALLOX_TEST_KEEP=1`` keeps the work directory (logs) after the run.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import httpx
import pytest

HERE = Path(__file__).resolve().parent
try:
    import allox  # installed: pip install ./clients/python
except ImportError:  # or straight from this checkout
    sys.path.insert(0, str(HERE.parent))
    import allox

START_TIMEOUT = 30.0


class Gateway(NamedTuple):
    """What the ``gateway`` fixture yields: unpacks as ``(base_url, token)``."""

    base_url: str
    token: str


@dataclass
class Env:
    work: Path
    mnt: Path
    root: Path
    socket: Path
    token_file: Path
    cgroup: Path
    daemon: subprocess.Popen
    gateway: subprocess.Popen | None
    daemon_log: Path
    gateway_log: Path
    base_url: str = ""
    token: str = ""


def _fail(msg: str) -> None:
    pytest.fail(msg, pytrace=False)


def _binary(var: str) -> str:
    path = os.environ.get(var)
    if not path:
        _fail(
            f"{var} is not set: point it at the {var.lower().replace('_', '-')} binary to test, e.g. "
            f"{var}=/work/ci/target/x86_64-unknown-linux-gnu/debug/{'allox-init' if var == 'ALLOX_INIT' else 'alloxctl'}"
        )
    if not os.path.isfile(path):
        _fail(f"{var}={path}: no such file")
    if not os.access(path, os.X_OK):
        _fail(f"{var}={path}: not executable")
    return path


def cgroup2_mount() -> Path | None:
    for p in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if Path(p, "cgroup.subtree_control").exists():
            return Path(p)
    return None


def _missing() -> list[str]:
    miss = []
    if os.geteuid() != 0:
        miss.append("root (the daemon mounts Btrfs and makes sandboxes; run pytest as root)")
    for tool, pkg in (("mkfs.btrfs", "btrfs-progs"), ("mount", "mount"), ("umount", "mount")):
        if shutil.which(tool) is None:
            miss.append(f"{tool} (apt-get install {pkg})")
    if not Path("/dev/loop-control").exists():
        miss.append("loop devices (/dev/loop-control)")
    fs = Path("/proc/filesystems").read_text() if Path("/proc/filesystems").exists() else ""
    if "btrfs" not in fs and not Path("/sys/module/btrfs").exists():
        subprocess.run(["modprobe", "btrfs"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        fs = Path("/proc/filesystems").read_text()
        if "btrfs" not in fs:
            miss.append("the btrfs kernel module (modprobe btrfs)")
    if cgroup2_mount() is None:
        miss.append("a cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified) for the sessions' processes")
    return miss


def _run(cmd: list[str]) -> None:
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")


def _tail(path: Path, n: int = 40) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no {path})"
    return "\n".join(lines[-n:])


def _stop(p: subprocess.Popen | None, timeout: float) -> None:
    if p is None or p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)


def _remove_cgroup(cg: Path) -> None:
    if not cg.exists():
        return
    try:
        (cg / "cgroup.kill").write_text("1")
    except OSError:
        pass
    for _ in range(100):
        try:
            if "populated 1" not in (cg / "cgroup.events").read_text():
                break
        except OSError:
            break
        time.sleep(0.05)
    for d in sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    try:
        cg.rmdir()
    except OSError as e:
        print(f"conftest: cannot remove cgroup {cg}: {e}", file=sys.stderr)


def _umount(mnt: Path) -> None:
    for _ in range(50):
        if subprocess.run(["umount", str(mnt)], stderr=subprocess.DEVNULL, check=False).returncode == 0:
            return
        if not os.path.ismount(mnt):
            return
        time.sleep(0.1)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _wait_socket(path: Path, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proc.poll() is not None:
            _fail(f"allox-init exited ({proc.returncode}) before serving {path}:\n{_tail(log)}")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            _fail(f"allox-init did not listen on {path} within {START_TIMEOUT:.0f} s:\n{_tail(log)}")
        time.sleep(0.05)


def _wait_gateway(proc: subprocess.Popen, log: Path, token_file: Path) -> tuple[str, str]:
    deadline = time.monotonic() + START_TIMEOUT
    addr = None
    while addr is None:
        if proc.poll() is not None:
            _fail(f"alloxctl gateway exited ({proc.returncode}) before listening:\n{_tail(log)}")
        m = re.search(r"http://([0-9.]+:\d+)/", log.read_text(errors="replace") if log.exists() else "")
        if m:
            addr = m.group(1)
            break
        if time.monotonic() > deadline:
            _fail(f"alloxctl gateway did not say where it listens within {START_TIMEOUT:.0f} s:\n{_tail(log)}")
        time.sleep(0.05)
    base_url = f"http://{addr}"
    token = token_file.read_text().strip()
    # Served once a ping comes back.
    last = ""
    while True:
        try:
            r = httpx.post(
                f"{base_url}/v1/rpc",
                content=b'{"action":"system.ping","params":{}}',
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                timeout=5,
            )
            if r.status_code == 200:
                return base_url, token
            last = f"HTTP {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as e:
            last = repr(e)
        if proc.poll() is not None or time.monotonic() > deadline:
            _fail(f"the gateway at {base_url} does not answer system.ping ({last}):\n{_tail(log)}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def allox_env(request: pytest.FixtureRequest):
    """The daemon and the gateway (see the module's docstring)."""
    init = _binary("ALLOX_INIT")
    ctl = _binary("ALLOXCTL")
    miss = _missing()
    if miss:
        _fail("these tests need the real daemon on a loop-backed Btrfs; this machine lacks: " + "; ".join(miss))
    Path("/var/tmp").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="allox-pytest-", dir="/var/tmp"))
    img, mnt = work / "fs.img", work / "mnt"
    mnt.mkdir()
    cg_mount = cgroup2_mount()
    assert cg_mount is not None
    cgroup = cg_mount / f"allox-pytest-{os.getpid()}"
    env: Env | None = None
    mounted = False
    try:
        with open(img, "wb") as f:
            f.truncate(1 << 30)
        try:
            _run(["mkfs.btrfs", "-q", "-f", str(img)])
            _run(["mount", "-o", "loop", str(img), str(mnt)])
        except RuntimeError as e:
            _fail(f"cannot make the loop-backed Btrfs: {e}")
        mounted = True
        root = mnt / "allox"
        root.mkdir()
        cgroup.mkdir(exist_ok=True)
        sock = work / "ctl.sock"
        token_file = work / "gateway.token"
        daemon_log, gateway_log = work / "daemon.log", work / "gateway.log"
        args = [
            init, "supervise", "--root", str(root), "--listen", f"unix:{sock}",
            "--cgroup-root", str(cgroup), "--sandbox-stage", str(work / "stage"),
        ] + shlex.split(os.environ.get("ALLOX_DAEMON_ARGS", ""))
        denv = dict(os.environ)
        denv.setdefault("ALLOX_LOG", "warn")
        with open(daemon_log, "wb") as out:
            daemon = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=denv)
        env = Env(work, mnt, root, sock, token_file, cgroup, daemon, None, daemon_log, gateway_log)
        _wait_socket(sock, daemon, daemon_log)
        genv = dict(os.environ, ALLOX_SOCKET=str(sock))
        genv.pop("ALLOX_TOKEN_FILE", None)
        with open(gateway_log, "wb") as out:
            env.gateway = subprocess.Popen(
                [ctl, "gateway", "--listen", "127.0.0.1:0", "--token-file", str(token_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=genv,
            )
        env.base_url, env.token = _wait_gateway(env.gateway, gateway_log, token_file)
        yield env
    finally:
        failed = request.session.testsfailed
        if env is not None:
            _stop(env.gateway, 10)
            _stop(env.daemon, 30)
            if failed:
                print(f"\n--- gateway log ({env.gateway_log}) ---\n{_tail(env.gateway_log)}", file=sys.stderr)
                print(f"--- daemon log ({env.daemon_log}) ---\n{_tail(env.daemon_log)}", file=sys.stderr)
        _remove_cgroup(cgroup)
        if mounted:
            _umount(mnt)
        if os.environ.get("ALLOX_TEST_KEEP") == "1":
            print(f"conftest: kept {work}", file=sys.stderr)
            img.unlink(missing_ok=True)
        elif not os.path.ismount(mnt):
            shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="session")
def gateway(allox_env: Env) -> Gateway:
    """``(base_url, token)`` of the running gateway."""
    return Gateway(allox_env.base_url, allox_env.token)


@pytest.fixture
def client(gateway: Gateway):
    with allox.Client(gateway.base_url, token=gateway.token) as c:
        yield c


@pytest.fixture
def agent(client) -> str:
    """A new agent of this test's own (deleted afterwards)."""
    name = f"agent-{uuid.uuid4().hex[:10]}"
    client.agent_create(name)
    yield name
    try:
        client.agent_delete(name)
    except allox.AlloxError:
        pass
