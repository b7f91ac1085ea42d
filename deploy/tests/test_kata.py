"""deploy/kata/: the drop-in, the kata-deploy values, the RuntimeClass and
the kernel fragment agree with each other, with the manifests and with
what the docs promise."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

import manifests
import policy

KATA = manifests.DEPLOY / "kata"
DROP_IN = KATA / "kata-allox.toml"
VALUES = KATA / "kata-deploy-values.yaml"
RUNTIME_CLASS = KATA / "runtimeclass.yaml"
FRAGMENT = KATA / "kernel" / "allox.conf"
# Base configurations kata-deploy installs whose hypervisor section is
# [hypervisor.qemu]: the Go runtime's and runtime-rs's.
QEMU_BASES = {"qemu", "qemu-runtime-rs"}
# This repository's guest kernel fragments whose symbols the supervisor
# relies on (the rest are the guest's own hardware and boot).
OWN_FRAGMENTS = ["btrfs", "cgroups", "bpf", "namespaces", "seccomp"]
OWN_NET_SYMBOLS = {"CONFIG_INET_DIAG", "CONFIG_INET_TCP_DIAG"}


def drop_in() -> dict:
    with open(DROP_IN, "rb") as f:
        return tomllib.load(f)


def values() -> dict:
    return yaml.safe_load(VALUES.read_text())


def custom_runtime() -> dict:
    runtimes = values()["customRuntimes"]["runtimes"]
    assert len(runtimes) == 1
    return next(iter(runtimes.values()))


def lookup(table: dict, dotted: str):
    for part in dotted.split("."):
        assert isinstance(table, dict) and part in table, f"no key {dotted}"
        table = table[part]
    return table


def promised_keys(path) -> set[str]:
    """The drop-in keys a document promises: the first cells of the table
    that follows its words "drop-in's keys"."""
    text = path.read_text()
    assert "drop-in's keys" in text, f"{path} has no table of the drop-in's keys"
    rows = []
    for ln in text[text.index("drop-in's keys"):].splitlines()[1:]:
        if ln.startswith("|"):
            rows.append(ln)
        elif rows:
            break
    return {m.group(1) for ln in rows
            if (m := re.match(r"\| `([a-z_]+(?:\.[a-z_]+)+)` \|", ln))}


def test_drop_in_parses_and_boots_the_allox_kernel():
    conf = drop_in()
    qemu = conf["hypervisor"]["qemu"]
    assert qemu["kernel"].startswith("/") and qemu["kernel"].endswith(".container")
    assert not qemu["kernel"].startswith("/opt/kata/"), "kata-deploy owns /opt/kata"
    params = qemu["kernel_params"].split()
    assert "systemd.unified_cgroup_hierarchy=1" in params
    assert "cgroup_no_v1=all" in params
    assert isinstance(qemu["default_vcpus"], int) and qemu["default_vcpus"] >= 1
    assert isinstance(qemu["default_memory"], int) and qemu["default_memory"] >= 256
    assert conf["runtime"]["static_sandbox_resource_mgmt"] is True
    assert set(conf) == {"hypervisor", "runtime"} and set(conf["hypervisor"]) == {"qemu"}


@pytest.mark.parametrize("doc", [manifests.DOCS, KATA / "README.md"],
                         ids=["docs/deploy.md", "deploy/kata/README.md"])
def test_drop_in_has_the_keys_the_docs_promise(doc):
    keys = promised_keys(doc)
    assert len(keys) >= 5, f"{doc} lists no drop-in keys"
    conf = drop_in()
    for key in keys:
        lookup(conf, key)


def test_docs_list_every_key_of_the_drop_in():
    conf = drop_in()
    keys = {f"{t}.{k}" for t, tv in (("hypervisor.qemu", conf["hypervisor"]["qemu"]),
                                     ("runtime", conf["runtime"])) for k in tv}
    assert keys <= promised_keys(manifests.DOCS)


def test_values_carry_the_drop_in_and_a_qemu_base():
    rt = custom_runtime()
    assert values()["customRuntimes"]["enabled"] is True
    assert rt["baseConfig"] in QEMU_BASES
    assert tomllib.loads(rt["dropIn"]) == drop_in()


def test_values_runtime_class_is_the_files():
    rt = custom_runtime()
    embedded = yaml.safe_load(rt["runtimeClass"])
    assert embedded == yaml.safe_load(RUNTIME_CLASS.read_text())


def test_the_handler_the_chart_reads_is_the_runtime_class_and_the_pods():
    # The chart takes the handler from the runtimeClass text's `handler:`
    # line; containerd's runtime, the RuntimeClass and the pods must agree.
    lines = [ln.strip() for ln in custom_runtime()["runtimeClass"].splitlines()]
    handlers = [ln[len("handler:"):].strip() for ln in lines if ln.startswith("handler:")]
    rc = yaml.safe_load(RUNTIME_CLASS.read_text())
    assert handlers == [rc["handler"]] == [rc["metadata"]["name"]] == [policy.RUNTIME_CLASS]


def test_runtime_class_schedules_on_kata_nodes_and_counts_the_guest():
    rc = yaml.safe_load(RUNTIME_CLASS.read_text())
    assert rc["scheduling"]["nodeSelector"] == {"katacontainers.io/kata-runtime": "true"}
    fixed = rc["overhead"]["podFixed"]
    assert manifests.quantity(fixed["cpu"]) > 0
    guest = drop_in()["hypervisor"]["qemu"]["default_memory"] * 2 ** 20
    assert manifests.quantity(fixed["memory"]) > guest


@pytest.mark.parametrize("version", manifests.k8s_versions())
def test_embedded_runtime_class_validates(version, tmp_path):
    rc = yaml.safe_load(custom_runtime()["runtimeClass"])
    assert manifests.validate([rc], version, tmp_path) == []


def config_lines(path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines()
            if ln.strip() and (not ln.startswith("#") or ln.endswith(" is not set"))]


def symbols(path) -> dict[str, str]:
    out = {}
    for ln in config_lines(path):
        m = re.fullmatch(r"(CONFIG_[A-Z0-9_]+)=(y|m|n|\".*\"|-?\d+)", ln) or \
            re.fullmatch(r"# (CONFIG_[A-Z0-9_]+) is not set", ln)
        assert m, f"{path.name}: not a config line: {ln!r}"
        out[m.group(1)] = m.group(2) if m.lastindex == 2 else "n"
    return out


def test_fragment_is_a_kconfig_fragment_without_repeats():
    lines = config_lines(FRAGMENT)
    names = [re.sub(r"^# |=.*$| is not set$", "", ln) for ln in lines]
    assert len(names) == len(set(names))
    values_ = symbols(FRAGMENT)
    # No modules in Kata's x86_64 kernel: everything the supervisor needs is built in.
    assert set(values_.values()) == {"y"}


def test_fragment_has_what_the_supervisor_needs():
    have = symbols(FRAGMENT)
    for s in ("CONFIG_BTRFS_FS", "CONFIG_BTRFS_FS_POSIX_ACL", "CONFIG_DEBUG_INFO_BTF",
              "CONFIG_DEBUG_INFO", "CONFIG_BPF_SYSCALL", "CONFIG_CGROUP_BPF", "CONFIG_BPF_JIT",
              "CONFIG_MEMCG", "CONFIG_CGROUP_PIDS", "CONFIG_CFS_BANDWIDTH"):
        assert have.get(s) == "y", s


def test_fragment_has_every_symbol_of_the_own_kernels_fragments():
    have = symbols(FRAGMENT)
    wanted = set(OWN_NET_SYMBOLS)
    for name in OWN_FRAGMENTS:
        wanted |= {s for s, v in symbols(manifests.REPO / "kernel" / "config" / f"{name}.config").items()
                   if v == "y"}
    assert sorted(wanted - set(have)) == []
