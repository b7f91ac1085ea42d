"""The deployment's rules over every rendered kustomization, and each rule
seen to fail on a copy of the base's output broken in that one way."""

from __future__ import annotations

import copy

import pytest

import manifests
import policy

KUSTOMIZATIONS = sorted(manifests.KUSTOMIZATIONS)


def is_vm(name: str) -> bool:
    return name not in manifests.RUNC_KUSTOMIZATIONS


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_rendered_kustomization_keeps_the_rules(rendered, name):
    assert policy.violations(rendered[name], vm=is_vm(name)) == []


def test_runtime_class_is_kata_allox_except_in_runc_dev(rendered):
    assert any("runtimeClassName" in v for v in policy.violations(rendered["overlays/runc-dev"], vm=True))
    assert any("runtimeClassName" in v for v in policy.violations(rendered["base"], vm=False))


def of_kind(docs, kind):
    return next(d for d in docs if d["kind"] == kind)


def pod(docs):
    return of_kind(docs, "StatefulSet")["spec"]["template"]["spec"]


def container(docs, name):
    return next(c for c in pod(docs)["containers"] if c["name"] == name)


def claim(docs):
    return of_kind(docs, "StatefulSet")["spec"]["volumeClaimTemplates"][0]["spec"]


def netpol(docs):
    return of_kind(docs, "NetworkPolicy")["spec"]


def gateway_sc(docs):
    return container(docs, "gateway")["securityContext"]


def annotations(docs):
    return of_kind(docs, "StatefulSet")["spec"]["template"]["metadata"]["annotations"]


def set_arg(docs, name, flag, value):
    c = container(docs, name)
    c["args"] = [a for a in c["args"] if not a.startswith(flag)] + [f"{flag}={value}"]


def drop_arg(docs, name, flag):
    c = container(docs, name)
    c["args"] = [a for a in c["args"] if a != flag and not a.startswith(flag + "=")]


def metrics_token_from(docs, secret, key):
    """The gateway given a metrics token from `key` of `secret`."""
    c = container(docs, "gateway")
    c["env"].append({"name": "ALLOX_METRICS_TOKEN",
                     "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}})
    set_arg(docs, "gateway", "--metrics-token-env", "ALLOX_METRICS_TOKEN")


# (what is broken, how, a word the report must hold)
MUTATIONS = [
    ("gateway privileged", lambda d: gateway_sc(d).update(privileged=True), "privileged"),
    ("store without volumeMode", lambda d: claim(d).pop("volumeMode"), "volumeMode"),
    ("store as a filesystem claim", lambda d: claim(d).update(volumeMode="Filesystem"), "volumeMode"),
    ("store shared", lambda d: claim(d).update(accessModes=["ReadWriteMany"]), "accessModes"),
    ("store mounted, not a device", lambda d: (
        container(d, "supervisor").pop("volumeDevices"),
        container(d, "supervisor")["volumeMounts"].append({"name": "store", "mountPath": "/store"})),
     "volumeDevices"),
    ("store at another path", lambda d: container(d, "supervisor")["volumeDevices"][0].update(
        devicePath="/dev/xvdb"), "/dev/allox-store"),
    ("claim deleted with the set", lambda d: of_kind(d, "StatefulSet")["spec"].update(
        persistentVolumeClaimRetentionPolicy={"whenDeleted": "Delete", "whenScaled": "Retain"}),
     "Retain"),
    ("two replicas", lambda d: of_kind(d, "StatefulSet")["spec"].update(replicas=2), "replicas"),
    ("no runtime class", lambda d: pod(d).pop("runtimeClassName"), "runtimeClassName"),
    ("another runtime class", lambda d: pod(d).update(runtimeClassName="kata-qemu"), "runtimeClassName"),
    ("hostPath volume", lambda d: pod(d)["volumes"].append(
        {"name": "host", "hostPath": {"path": "/"}}), "hostPath"),
    ("host network", lambda d: pod(d).update(hostNetwork=True), "hostNetwork"),
    ("host PID", lambda d: pod(d).update(hostPID=True), "hostPID"),
    ("host IPC", lambda d: pod(d).update(hostIPC=True), "hostIPC"),
    ("host port", lambda d: container(d, "gateway")["ports"][0].update(hostPort=8092), "hostPort"),
    ("gateway limit above request", lambda d: container(d, "gateway")["resources"]["limits"].update(
        memory="256Mi"), "memory requests"),
    ("supervisor without a cpu limit", lambda d: container(d, "supervisor")["resources"]["limits"].pop(
        "cpu"), "cpu requests and limits"),
    ("grace period under the stop timeout", lambda d: pod(d).update(terminationGracePeriodSeconds=15),
     "terminationGracePeriodSeconds"),
    ("stop timeout over the grace period", lambda d: set_arg(d, "supervisor", "--stop-timeout", "60"),
     "--stop-timeout 60"),
    ("image by tag", lambda d: container(d, "gateway").update(image="allox:latest"), "by digest"),
    ("gateway as root", lambda d: gateway_sc(d).update(runAsUser=0), "runAsUser"),
    ("gateway may run as root", lambda d: gateway_sc(d).pop("runAsNonRoot"), "runAsNonRoot"),
    ("gateway writes its root", lambda d: gateway_sc(d).update(readOnlyRootFilesystem=False),
     "readOnlyRootFilesystem"),
    ("gateway escalates", lambda d: gateway_sc(d).update(allowPrivilegeEscalation=True),
     "allowPrivilegeEscalation"),
    ("gateway keeps capabilities", lambda d: gateway_sc(d).pop("capabilities"), "capabilities"),
    ("gateway adds a capability", lambda d: gateway_sc(d)["capabilities"].update(add=["NET_ADMIN"]),
     "capabilities"),
    ("gateway unconfined", lambda d: gateway_sc(d).update(seccompProfile={"type": "Unconfined"}),
     "seccompProfile"),
    ("container flag after the supervise options", lambda d: container(d, "supervisor").update(
        args=[a for a in container(d, "supervisor")["args"] if a != "--format-blank"]
        + ["--format-blank"]), "must come before"),
    ("gateway's user not allowed on the socket", lambda d: set_arg(d, "supervisor", "--allow-uid", "1000"),
     "--allow-uid"),
    ("token not from a Secret", lambda d: container(d, "gateway").update(
        env=[{"name": "ALLOX_GATEWAY_TOKEN", "value": "x" * 64}]), "not from a Secret"),
    ("token from a missing Secret", lambda d: container(d, "gateway")["env"][0]["valueFrom"][
        "secretKeyRef"].update(name="elsewhere"), "not among the manifests"),
    ("socket dir on disk", lambda d: next(v for v in pod(d)["volumes"] if v["name"] == "run-allox")[
        "emptyDir"].pop("medium"), "in-memory"),
    ("no liveness probe", lambda d: container(d, "supervisor").pop("livenessProbe"), "livenessProbe"),
    ("gateway ready on a bare port", lambda d: container(d, "gateway").update(
        readinessProbe={"tcpSocket": {"port": "http"}}), "GET /readyz"),
    ("gateway without liveness", lambda d: container(d, "gateway").pop("livenessProbe"),
     "GET /healthz"),
    ("service account token", lambda d: pod(d).pop("automountServiceAccountToken"),
     "automountServiceAccountToken"),
    ("service links", lambda d: pod(d).update(enableServiceLinks=True), "enableServiceLinks"),
    ("policy selects another pod", lambda d: netpol(d)["podSelector"]["matchLabels"].update(
        {"app.kubernetes.io/name": "other"}), "no NetworkPolicy selects"),
    ("ingress from every pod", lambda d: netpol(d)["ingress"][0]["from"][0].update(
        podSelector={}), "ingress from"),
    ("ingress from any namespace", lambda d: netpol(d)["ingress"][0]["from"].append(
        {"namespaceSelector": {}}), "ingress from"),
    ("ingress from anywhere", lambda d: netpol(d)["ingress"][0].pop("from"), "every source"),
    ("ingress to another port", lambda d: netpol(d)["ingress"][0]["ports"].append(
        {"protocol": "TCP", "port": 22}), "ingress to ports"),
    ("no egress policy", lambda d: netpol(d).update(policyTypes=["Ingress"]), "policyTypes"),
    ("egress anywhere", lambda d: netpol(d)["egress"].append({}), "every destination"),
    ("egress to the metadata service", lambda d: netpol(d)["egress"][1]["to"][0]["ipBlock"][
        "except"].remove("169.254.0.0/16"), "169.254.0.0/16"),
    ("egress to the cluster's pods", lambda d: netpol(d)["egress"][1]["to"].append(
        {"podSelector": {}}), "neither the cluster's DNS"),
    ("egress over UDP", lambda d: netpol(d)["egress"][1]["ports"].append({"protocol": "UDP"}),
     "TCP only"),
    ("service on the nodes", lambda d: of_kind(d, "Service")["spec"].update(type="NodePort"),
     "NodePort"),
    ("no metrics address", lambda d: drop_arg(d, "gateway", "--metrics-listen"),
     "no --metrics-listen"),
    ("metrics address on another port", lambda d: set_arg(
        d, "gateway", "--metrics-listen", "0.0.0.0:9465"), "not 0.0.0.0:9464"),
    ("metrics address on loopback", lambda d: set_arg(
        d, "gateway", "--metrics-listen", "127.0.0.1:9464"), "not 0.0.0.0:9464"),
    ("metrics container port elsewhere", lambda d: container(d, "gateway")["ports"][1].update(
        containerPort=9465), "no container port"),
    ("no scrape annotation", lambda d: annotations(d).pop("prometheus.io/scrape"),
     "no annotation prometheus.io/scrape"),
    ("scrape annotation on the gateway's port", lambda d: annotations(d).update(
        {"prometheus.io/port": "8092"}), "prometheus.io/port is '8092'"),
    ("scrape annotation on another path", lambda d: annotations(d).update(
        {"prometheus.io/path": "/v1/metrics"}), "prometheus.io/path"),
    ("metrics token is the gateway's token", lambda d: set_arg(
        d, "gateway", "--metrics-token-env", "ALLOX_GATEWAY_TOKEN"), "never hold the gateway's token"),
    ("metrics token from the gateway's Secret", lambda d: metrics_token_from(
        d, container(d, "gateway")["env"][0]["valueFrom"]["secretKeyRef"]["name"], "metrics"),
     "never hold the gateway's token"),
    ("metrics token file is the gateway's", lambda d: (
        set_arg(d, "gateway", "--metrics-token-file", "/run/allox/gateway.token"),
        drop_arg(d, "gateway", "--token-env"),
        set_arg(d, "gateway", "--token-file", "/run/allox/gateway.token")),
     "never hold the gateway's token"),
    ("metrics ingress from every pod", lambda d: netpol(d)["ingress"][1]["from"][0].update(
        podSelector={}), "ingress from"),
    ("metrics ingress from every namespace", lambda d: netpol(d)["ingress"][1]["from"][0].update(
        namespaceSelector={}), "ingress from"),
    ("metrics ingress from the namespaces' every pod", lambda d: netpol(d)["ingress"][1].update(
        {"from": [{"namespaceSelector": policy.SCRAPER_PEER["namespaceSelector"]},
                  {"podSelector": policy.SCRAPER_PEER["podSelector"]}]}), "ingress from"),
    ("scrapers admitted to the gateway's port", lambda d: netpol(d)["ingress"][1]["ports"].append(
        {"protocol": "TCP", "port": 8092}), "ingress to ports"),
    ("clients admitted to the metrics port", lambda d: netpol(d)["ingress"][0]["ports"].append(
        {"protocol": "TCP", "port": 9464}), "ingress to ports"),
    ("a port range for the scrapers", lambda d: netpol(d)["ingress"][1]["ports"][0].update(
        endPort=9500), "ingress to ports"),
    ("one rule for clients and scrapers", lambda d: netpol(d)["ingress"][0]["from"].append(
        copy.deepcopy(policy.SCRAPER_PEER)), "each needs a rule of its own"),
    ("no metrics ingress", lambda d: netpol(d)["ingress"].pop(1), "admits the metrics scrapers"),
    ("service exposes the metrics port", lambda d: of_kind(d, "Service")["spec"]["ports"].append(
        {"name": "metrics", "port": 9464, "targetPort": "metrics", "protocol": "TCP"}),
     "never through the Service"),
    ("service forwards to the metrics port", lambda d: of_kind(d, "Service")["spec"]["ports"][0].update(
        targetPort="metrics"), "never through the Service"),
    ("a second workload", lambda d: d.append({"apiVersion": "v1", "kind": "Pod",
                                              "metadata": {"name": "x"}, "spec": {}}),
     "other than the runtime's"),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in MUTATIONS],
                         ids=[n for n, _, _ in MUTATIONS])
def test_each_rule_can_fail(rendered, mutate, expected):
    docs = copy.deepcopy(rendered["base"])
    mutate(docs)
    found = policy.violations(docs, vm=True)
    assert any(expected in v for v in found), found


def sandbox_of(docs):
    return of_kind(docs, "Sandbox")["spec"]["podTemplate"]


SANDBOX_MUTATIONS = [
    ("claim missing", lambda d: d.remove(of_kind(d, "PersistentVolumeClaim")), "not among the manifests"),
    ("claim is a filesystem", lambda d: of_kind(d, "PersistentVolumeClaim")["spec"].update(
        volumeMode="Filesystem"), "volumeMode"),
    ("store volume removed", lambda d: sandbox_of(d)["spec"].update(volumes=[
        v for v in sandbox_of(d)["spec"]["volumes"] if v["name"] != "store"]), "no claim named"),
    ("no runtime class", lambda d: sandbox_of(d)["spec"].pop("runtimeClassName"), "runtimeClassName"),
    ("gateway privileged", lambda d: next(c for c in sandbox_of(d)["spec"]["containers"]
                                          if c["name"] == "gateway")["securityContext"].update(
        privileged=True), "privileged"),
    ("no scrape annotations", lambda d: sandbox_of(d)["metadata"].pop("annotations"),
     "no annotation prometheus.io/scrape"),
    ("no metrics address", lambda d: next(c for c in sandbox_of(d)["spec"]["containers"]
                                          if c["name"] == "gateway")["args"].remove(
        "--metrics-listen=0.0.0.0:9464"), "no --metrics-listen"),
]


@pytest.mark.parametrize("mutate,expected", [(m, e) for _, m, e in SANDBOX_MUTATIONS],
                         ids=[n for n, _, _ in SANDBOX_MUTATIONS])
def test_each_rule_can_fail_for_the_sandbox(rendered, mutate, expected):
    docs = copy.deepcopy(rendered["sandbox"])
    mutate(docs)
    found = policy.violations(docs, vm=True)
    assert any(expected in v for v in found), found


def test_the_sandbox_runs_the_statefulsets_pod(rendered):
    sts = of_kind(rendered["base"], "StatefulSet")["spec"]
    box = copy.deepcopy(of_kind(rendered["sandbox"], "Sandbox")["spec"]["podTemplate"])
    store = [v for v in box["spec"]["volumes"] if v["name"] == "store"]
    box["spec"]["volumes"] = [v for v in box["spec"]["volumes"] if v["name"] != "store"]
    assert box == sts["template"]
    claim_name = store[0]["persistentVolumeClaim"]["claimName"]
    claim_doc = next(d for d in rendered["sandbox"]
                     if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == claim_name)
    assert claim_doc["spec"] == sts["volumeClaimTemplates"][0]["spec"]


def test_the_runc_overlay_changes_only_the_runtime_class(rendered):
    base = copy.deepcopy(rendered["base"])
    pod(base).pop("runtimeClassName")
    assert base == rendered["overlays/runc-dev"]


def test_quantities_compare_by_value():
    assert manifests.quantity("2") == manifests.quantity("2000m")
    assert manifests.quantity("1Gi") == manifests.quantity("1024Mi")
    assert manifests.quantity("1G") != manifests.quantity("1Gi")
    with pytest.raises(ValueError):
        manifests.quantity("two")
