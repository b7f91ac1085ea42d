"""The deployment's rules (docs/deploy.md), as one function over the
manifests a kustomization renders: `violations(docs, vm=...)` lists every
rule broken, and an empty list is a pass.

test_policy.py runs it on every rendered kustomization, and on copies
mutated one rule at a time, so that each rule is seen to fail.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from manifests import quantity

RUNTIME_CLASS = "kata-allox"
STORE = "store"
STORE_DEVICE = "/dev/allox-store"
SOCKET_DIR = "/run/allox"
CLIENT_LABELS = {"allox.dev/client": "true"}
GATEWAY_PORT = 8092
# The gateway's metrics address (--metrics-listen): GET /metrics with no
# token, scraped on the pod by annotation, never through the Service, and
# reachable only by the scrapers: pods labelled SCRAPER_LABELS in
# namespaces labelled SCRAPER_NAMESPACE_LABELS, named by one peer.
METRICS_PORT = 9464
METRICS_PATH = "/metrics"
SCRAPER_LABELS = {"allox.dev/metrics-scraper": "true"}
SCRAPER_NAMESPACE_LABELS = {"allox.dev/metrics": "true"}
CLIENT_PEER = {"podSelector": {"matchLabels": CLIENT_LABELS}}
SCRAPER_PEER = {"namespaceSelector": {"matchLabels": SCRAPER_NAMESPACE_LABELS},
                "podSelector": {"matchLabels": SCRAPER_LABELS}}
SCRAPE_ANNOTATIONS = {"prometheus.io/scrape": "true",
                      "prometheus.io/port": str(METRICS_PORT),
                      "prometheus.io/path": METRICS_PATH}
DEFAULT_STOP_TIMEOUT = 20
PRIVILEGED_CONTAINERS = {"supervisor"}
# The flags of `/init container` itself; the rest are `supervise` options.
CONTAINER_FLAGS = {"--store", "--format-blank", "--stop-timeout"}
# What no egress rule may reach (the broker refuses them too): private,
# shared (CGNAT), loopback, link-local (cloud metadata) and unique-local.
FORBIDDEN_EGRESS = [ipaddress.ip_network(n) for n in (
    "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
    "172.16.0.0/12", "192.168.0.0/16", "::1/128", "fc00::/7", "fe80::/10")]
POD_KINDS = {"Pod", "Deployment", "ReplicaSet", "DaemonSet", "Job", "CronJob",
             "ReplicationController"}


@dataclass
class Workload:
    """A pod template that runs the runtime, with its store claims."""
    where: str
    kind: str
    replicas: int
    labels: dict
    annotations: dict
    spec: dict
    claims: dict = field(default_factory=dict)  # volume name -> claim spec
    retention: dict | None = None


def workloads(docs: list[dict], out: list[str]) -> list[Workload]:
    claims_by_name = {d["metadata"]["name"]: d["spec"]
                      for d in docs if d["kind"] == "PersistentVolumeClaim"}
    found = []
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "StatefulSet":
            s = d["spec"]
            t = s["template"]
            claims = {c["metadata"]["name"]: c["spec"] for c in s.get("volumeClaimTemplates", [])}
            meta = t.get("metadata", {})
            found.append(Workload(name, d["kind"], s.get("replicas", 1),
                                  meta.get("labels", {}), meta.get("annotations", {}), t["spec"],
                                  claims, s.get("persistentVolumeClaimRetentionPolicy")))
        elif d["kind"] == "Sandbox":
            s = d["spec"]
            t = s["podTemplate"]
            claims = {c["metadata"]["name"]: c["spec"] for c in s.get("volumeClaimTemplates", [])}
            for v in t["spec"].get("volumes", []):
                ref = v.get("persistentVolumeClaim")
                if ref is None:
                    continue
                if ref["claimName"] in claims_by_name:
                    claims[v["name"]] = claims_by_name[ref["claimName"]]
                else:
                    out.append(f"{name}: volume {v['name']!r} names claim "
                               f"{ref['claimName']!r}, which is not among the manifests")
            meta = t.get("metadata", {})
            found.append(Workload(name, d["kind"], s.get("replicas", 1),
                                  meta.get("labels", {}), meta.get("annotations", {}), t["spec"],
                                  claims))
        elif d["kind"] in POD_KINDS:
            out.append(f"{name}: a workload other than the runtime's")
    return found


def violations(docs: list[dict], vm: bool = True) -> list[str]:
    out: list[str] = []
    ws = workloads(docs, out)
    if len(ws) != 1:
        out.append(f"expected the runtime's one pod template, found {len(ws)}")
    for w in ws:
        check_workload(w, docs, vm, out)
        check_network_policy(w, docs, out)
        check_services(w, docs, out)
    return out


def containers_of(spec: dict) -> list[dict]:
    return spec.get("initContainers", []) + spec.get("containers", []) + \
        spec.get("ephemeralContainers", [])


def arg_values(argv: list[str], flag: str) -> list[str]:
    """Every value of a flag, given as `--flag VALUE` or `--flag=VALUE`."""
    values = []
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            values.append(argv[i + 1])
        elif a.startswith(flag + "="):
            values.append(a[len(flag) + 1:])
    return values


def arg_value(argv: list[str], flag: str) -> str | None:
    """The last value of a flag (the one a parser keeps), or None."""
    values = arg_values(argv, flag)
    return values[-1] if values else None


def check_workload(w: Workload, docs: list[dict], vm: bool, out: list[str]) -> None:
    at = w.where
    spec = w.spec
    if w.replicas != 1:
        out.append(f"{at}: replicas {w.replicas}: one runtime per user, one store")
    if w.kind == "StatefulSet" and w.retention != {"whenDeleted": "Retain", "whenScaled": "Retain"}:
        out.append(f"{at}: persistentVolumeClaimRetentionPolicy {w.retention}: the store claim "
                   "must be retained when the set is deleted or scaled")

    rc = spec.get("runtimeClassName")
    if vm and rc != RUNTIME_CLASS:
        out.append(f"{at}: runtimeClassName {rc!r}, not {RUNTIME_CLASS!r}")
    if not vm and rc is not None:
        out.append(f"{at}: runtimeClassName {rc!r} in a runc overlay")

    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            out.append(f"{at}: {key} is set")
    for v in spec.get("volumes", []):
        if "hostPath" in v:
            out.append(f"{at}: hostPath volume {v['name']!r}")
    if spec.get("automountServiceAccountToken") is not False:
        out.append(f"{at}: automountServiceAccountToken is not false")
    if spec.get("enableServiceLinks") is not False:
        out.append(f"{at}: enableServiceLinks is not false")

    cs = {c["name"]: c for c in containers_of(spec)}
    for name in ("supervisor", "gateway"):
        if name not in cs:
            out.append(f"{at}: no {name} container")
    for c in cs.values():
        check_container(at, c, out)

    sup = cs.get("supervisor")
    gw = cs.get("gateway")
    check_store(w, cs, out)
    if sup is not None:
        argv = sup.get("command", []) + sup.get("args", [])
        stop = arg_value(argv, "--stop-timeout")
        stop_s = int(stop) if stop is not None else DEFAULT_STOP_TIMEOUT
        grace = spec.get("terminationGracePeriodSeconds")
        if grace is None or grace <= stop_s:
            out.append(f"{at}: terminationGracePeriodSeconds {grace} is not above the "
                       f"supervisor's --stop-timeout {stop_s}")
        # `/init container` takes its own flags first: from the first
        # flag it does not know on, every argument is the supervisor's.
        own = [i for i, a in enumerate(argv) if a.split("=", 1)[0] in CONTAINER_FLAGS]
        others = [i for i, a in enumerate(argv[2:], 2) if a.startswith("--")
                  and a.split("=", 1)[0] not in CONTAINER_FLAGS]
        if own and others and max(own) > min(others):
            out.append(f"{at}: the supervisor's container flags {sorted(CONTAINER_FLAGS)} "
                       "must come before the supervise options")
        if arg_value(argv, "--store") != STORE_DEVICE:
            out.append(f"{at}: the supervisor's --store is not {STORE_DEVICE}")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            cmd = sup.get(probe, {}).get("exec", {}).get("command", [])
            if not cmd or cmd[-1] != "ping" or "alloxctl" not in cmd[0]:
                out.append(f"{at}: the supervisor's {probe} is not `alloxctl ping`")
        if gw is not None:
            uid = gw.get("securityContext", {}).get("runAsUser")
            if str(uid) not in arg_values(argv, "--allow-uid"):
                out.append(f"{at}: the supervisor does not --allow-uid the gateway's user {uid}")
    if gw is not None:
        check_gateway(at, gw, docs, out)
        check_metrics(w, gw, out)
    check_socket_dir(at, spec, [c for c in (sup, gw) if c is not None], out)


def check_container(at: str, c: dict, out: list[str]) -> None:
    name = c["name"]
    image = c.get("image", "")
    head, _, digest = image.partition("@sha256:")
    if not head or len(digest) != 64 or any(ch not in "0123456789abcdef" for ch in digest):
        out.append(f"{at}: container {name}: image {image!r} is not by digest")
    res = c.get("resources", {})
    for r in ("cpu", "memory"):
        req = res.get("requests", {}).get(r)
        lim = res.get("limits", {}).get(r)
        if req is None or lim is None:
            out.append(f"{at}: container {name}: {r} requests and limits must both be set")
        elif quantity(req) != quantity(lim):
            out.append(f"{at}: container {name}: {r} requests {req} != limits {lim}")
    for p in c.get("ports", []):
        if "hostPort" in p or "hostIP" in p:
            out.append(f"{at}: container {name}: hostPort")
    privileged = c.get("securityContext", {}).get("privileged", False)
    if privileged and name not in PRIVILEGED_CONTAINERS:
        out.append(f"{at}: container {name} is privileged; only the supervisor may be")


def check_store(w: Workload, cs: dict, out: list[str]) -> None:
    at = w.where
    claim = w.claims.get(STORE)
    if claim is None:
        out.append(f"{at}: no claim named {STORE!r}")
    else:
        if claim.get("volumeMode") != "Block":
            out.append(f"{at}: the store claim's volumeMode is {claim.get('volumeMode')!r}, not Block")
        if claim.get("accessModes") != ["ReadWriteOnce"]:
            out.append(f"{at}: the store claim's accessModes are {claim.get('accessModes')}, "
                       "not [ReadWriteOnce]")
    for c in cs.values():
        for m in c.get("volumeMounts", []):
            if m["name"] == STORE:
                out.append(f"{at}: container {c['name']} mounts the store as a filesystem "
                           "(volumeMounts); it is a block device (volumeDevices)")
        if c.get("volumeDevices") and c["name"] != "supervisor":
            out.append(f"{at}: container {c['name']} has a block device")
    sup = cs.get("supervisor")
    if sup is not None and {"name": STORE, "devicePath": STORE_DEVICE} not in sup.get("volumeDevices", []):
        out.append(f"{at}: the supervisor has no volumeDevices entry {STORE} at {STORE_DEVICE}")


def check_gateway(at: str, gw: dict, docs: list[dict], out: list[str]) -> None:
    sc = gw.get("securityContext", {})
    want = {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
            "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}
    for k, v in want.items():
        if sc.get(k) != v:
            out.append(f"{at}: gateway securityContext.{k} is {sc.get(k)!r}, not {v!r}")
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"] or caps.get("add"):
        out.append(f"{at}: gateway capabilities are not drop [ALL] with none added")
    if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        out.append(f"{at}: gateway seccompProfile is not RuntimeDefault")
    if sc.get("privileged"):
        out.append(f"{at}: gateway is privileged")

    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        got = gw.get(probe, {}).get("httpGet", {})
        if got.get("path") != path or got.get("port") not in ("http", 8092):
            out.append(f"{at}: the gateway's {probe} is not GET {path} on its port")

    argv = gw.get("command", []) + gw.get("args", [])
    env_name = arg_value(argv, "--token-env")
    env = {e["name"]: e for e in gw.get("env", [])}
    if env_name is None or env_name not in env:
        out.append(f"{at}: gateway --token-env names no variable of its env")
        return
    ref = env[env_name].get("valueFrom", {}).get("secretKeyRef")
    if ref is None:
        out.append(f"{at}: gateway token {env_name} is not from a Secret")
        return
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    secret = secrets.get(ref["name"])
    if secret is None:
        out.append(f"{at}: gateway token Secret {ref['name']!r} is not among the manifests")
    elif ref["key"] not in {**secret.get("data", {}), **secret.get("stringData", {})}:
        out.append(f"{at}: Secret {ref['name']!r} has no key {ref['key']!r}")
    if arg_value(argv, "--listen") != f"0.0.0.0:{GATEWAY_PORT}":
        out.append(f"{at}: gateway does not listen on 0.0.0.0:{GATEWAY_PORT}")


def check_metrics(w: Workload, gw: dict, out: list[str]) -> None:
    """The metrics address, its container port and the scrape annotations,
    and no metrics token that is the gateway's own."""
    at = w.where
    argv = gw.get("command", []) + gw.get("args", [])
    listen = arg_value(argv, "--metrics-listen")
    if listen is None:
        out.append(f"{at}: the gateway passes no --metrics-listen")
    elif listen != f"0.0.0.0:{METRICS_PORT}":
        out.append(f"{at}: the gateway's --metrics-listen is {listen!r}, not 0.0.0.0:{METRICS_PORT}")
    want = {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}
    if not any({**p, "protocol": p.get("protocol", "TCP")} == want for p in gw.get("ports", [])):
        out.append(f"{at}: the gateway declares no container port {want}")

    for key, value in SCRAPE_ANNOTATIONS.items():
        got = w.annotations.get(key)
        if got is None:
            out.append(f"{at}: the pod template has no annotation {key}")
        elif got != value:
            out.append(f"{at}: the pod template's annotation {key} is {got!r}, not {value!r}")

    # The gateway refuses to start with its own token as the metrics
    # token; this is the same rule on the manifests: a scraper must never
    # hold the token that can do everything. A metrics token comes from a
    # Secret of its own, which the scraper is given.
    token_env = arg_value(argv, "--token-env")
    env = {e["name"]: e for e in gw.get("env", [])}
    token_ref = env.get(token_env, {}).get("valueFrom", {}).get("secretKeyRef")
    for name in arg_values(argv, "--metrics-token-env"):
        ref = env.get(name, {}).get("valueFrom", {}).get("secretKeyRef")
        if name == token_env:
            out.append(f"{at}: the gateway's --metrics-token-env is its --token-env {name}: "
                       "a scraper must never hold the gateway's token")
        elif ref is None:
            out.append(f"{at}: the gateway's metrics token {name} is not from a Secret")
        elif token_ref is not None and ref["name"] == token_ref["name"]:
            out.append(f"{at}: the gateway's metrics token {name} is from the gateway's token "
                       f"Secret {ref['name']!r}: a scraper must never hold the gateway's token")
    token_file = arg_value(argv, "--token-file")
    for path in arg_values(argv, "--metrics-token-file"):
        if path == token_file:
            out.append(f"{at}: the gateway's --metrics-token-file is its --token-file {path}: "
                       "a scraper must never hold the gateway's token")


def check_socket_dir(at: str, spec: dict, cs: list[dict], out: list[str]) -> None:
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for c in cs:
        mounts = [m for m in c.get("volumeMounts", []) if m["mountPath"] == SOCKET_DIR]
        if not mounts:
            out.append(f"{at}: container {c['name']} does not mount {SOCKET_DIR}")
            continue
        v = volumes.get(mounts[0]["name"], {})
        if v.get("emptyDir", {}).get("medium") != "Memory":
            out.append(f"{at}: {SOCKET_DIR} is not an in-memory emptyDir")


def selects(selector: dict, labels: dict) -> bool:
    if selector.get("matchExpressions"):
        return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def check_network_policy(w: Workload, docs: list[dict], out: list[str]) -> None:
    at = w.where
    pols = [d for d in docs if d["kind"] == "NetworkPolicy"
            and selects(d["spec"].get("podSelector", {}), w.labels)]
    if not pols:
        out.append(f"{at}: no NetworkPolicy selects the pod")
        return
    scraped = False
    for p in pols:
        where = f"NetworkPolicy/{p['metadata']['name']}"
        s = p["spec"]
        if not {"Ingress", "Egress"} <= set(s.get("policyTypes", [])):
            out.append(f"{where}: policyTypes must hold Ingress and Egress")
        for rule in s.get("ingress", []):
            if check_ingress_rule(where, rule, out) == "metrics":
                scraped = True
        for rule in s.get("egress", []):
            check_egress_rule(where, rule, out)
    if not scraped:
        out.append(f"{at}: no NetworkPolicy admits the metrics scrapers ({SCRAPER_PEER}) "
                   f"to TCP {METRICS_PORT}")


def check_ingress_rule(where: str, rule: dict, out: list[str]) -> str | None:
    """An ingress rule is the clients' (client pods to the gateway's port)
    or the scrapers' (the scraper peer to the metrics port), never both.
    Returns which one a rule that keeps to this is ("client" or "metrics"),
    else None."""
    peers = rule.get("from", [])
    ports = rule.get("ports", [])
    if not peers:
        out.append(f"{where}: an ingress rule admits every source")
    kinds = set()
    unknown = False
    for peer in peers:
        if peer == CLIENT_PEER:
            kinds.add("client")
        elif peer == SCRAPER_PEER:
            kinds.add("metrics")
        else:
            unknown = True
            out.append(f"{where}: ingress from {peer}, neither the client pods (labelled "
                       f"{CLIENT_LABELS}) nor the metrics scrapers ({SCRAPER_PEER})")
    if kinds == {"client", "metrics"}:
        out.append(f"{where}: an ingress rule admits both the clients and the metrics scrapers: "
                   "each needs a rule of its own, to its own port")
        return None
    if kinds == {"metrics"}:
        allowed, who = {METRICS_PORT}, "the metrics scrapers"
    elif kinds == {"client"}:
        allowed, who = {GATEWAY_PORT}, "the clients"
    else:
        # No peer is one of the two, which is reported above; of the
        # ports, only those wrong for either are reported as well.
        allowed, who = {GATEWAY_PORT, METRICS_PORT}, "any source"
    if not ports or any(pt.get("port") not in allowed or "endPort" in pt
                        or pt.get("protocol", "TCP") != "TCP" for pt in ports):
        wanted = " or ".join(str(n) for n in sorted(allowed))
        out.append(f"{where}: ingress to ports {ports}, not only TCP {wanted} ({who})")
        return None
    if unknown or not kinds:
        return None
    return kinds.pop()


def check_egress_rule(where: str, rule: dict, out: list[str]) -> None:
    peers = rule.get("to", [])
    ports = rule.get("ports", [])
    if not peers:
        out.append(f"{where}: an egress rule reaches every destination")
        return
    for peer in peers:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            net = ipaddress.ip_network(block["cidr"])
            excepted = [ipaddress.ip_network(e) for e in block.get("except", [])]
            for bad in FORBIDDEN_EGRESS:
                if bad.version == net.version and bad.overlaps(net) and \
                        not any(bad.subnet_of(e) for e in excepted if e.version == bad.version):
                    out.append(f"{where}: egress to {net} reaches {bad}")
            if not ports or any(pt.get("protocol", "TCP") != "TCP" for pt in ports):
                out.append(f"{where}: egress to {net} is not TCP only")
        elif peer.get("podSelector", {}).get("matchLabels") == {"k8s-app": "kube-dns"} and \
                peer.get("namespaceSelector", {}).get("matchLabels") == \
                {"kubernetes.io/metadata.name": "kube-system"}:
            if not ports or any(pt.get("port") != 53 for pt in ports):
                out.append(f"{where}: egress to the cluster's DNS on ports other than 53")
        else:
            out.append(f"{where}: egress to {peer}, neither the cluster's DNS nor public addresses")


def check_services(w: Workload, docs: list[dict], out: list[str]) -> None:
    for d in docs:
        if d["kind"] != "Service":
            continue
        where = f"Service/{d['metadata']['name']}"
        s = d["spec"]
        if not selects({"matchLabels": s.get("selector", {})}, w.labels):
            out.append(f"{where}: does not select the runtime's pod")
        if s.get("type", "ClusterIP") != "ClusterIP":
            out.append(f"{where}: type {s.get('type')}: the gateway stays inside the cluster")
        for p in s.get("ports", []):
            if p.get("port") == METRICS_PORT or p.get("targetPort") in ("metrics", METRICS_PORT):
                out.append(f"{where}: port {p} is the metrics port: metrics are scraped from "
                           "the pod, never through the Service")
            elif p.get("port") != GATEWAY_PORT or p.get("targetPort") not in ("http", GATEWAY_PORT):
                out.append(f"{where}: port {p} is not the gateway's")
