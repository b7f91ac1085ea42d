"""Reading, rendering and validating the deployment's manifests.

Everything here works on a copy of deploy/ (the tests make one, with the
gateway's token file that the repository never holds) and runs offline:
`kubectl kustomize` renders, kubernetes-validate checks against the JSON
schemas it carries.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DOCS = REPO / "docs" / "deploy.md"

# Kustomizations whose pod runs without a VM (no runtimeClassName).
RUNC_KUSTOMIZATIONS = {"overlays/runc-dev"}
# Every kustomization under deploy/k8s; a new one is classified above (or
# not) and added here.
KUSTOMIZATIONS = {"base", "overlays/runc-dev", "sandbox"}

# The agent-sandbox Sandbox (agents.x-k8s.io/v1alpha1) spec's fields, from
# the CRD's Go types (SandboxSpec with its inlined Lifecycle).
SANDBOX_SPEC_FIELDS = {"podTemplate", "volumeClaimTemplates", "shutdownTime",
                       "shutdownPolicy", "replicas"}
SANDBOX_POD_TEMPLATE_FIELDS = {"metadata", "spec"}
SANDBOX_POD_METADATA_FIELDS = {"labels", "annotations"}
SANDBOX_CLAIM_METADATA_FIELDS = {"name", "labels", "annotations"}


def k8s_versions() -> tuple[str, str]:
    """The oldest and newest Kubernetes versions docs/deploy.md names, as
    kubernetes-validate takes them ("1.32.0")."""
    text = DOCS.read_text()
    oldest = re.search(r"\*\*(\d+\.\d+)\*\* \(oldest\)", text)
    newest = re.search(r"\*\*(\d+\.\d+)\*\* \(newest\)", text)
    assert oldest and newest, "docs/deploy.md names no **X.Y** (oldest) and **X.Y** (newest)"
    return f"{oldest.group(1)}.0", f"{newest.group(1)}.0"


def load_all(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomization_dirs(k8s: Path) -> dict[str, Path]:
    """Every directory under k8s/ holding a kustomization, by its path
    relative to k8s/."""
    return {str(p.parent.relative_to(k8s)): p.parent
            for p in sorted(k8s.rglob("kustomization.yaml"))}


def render(kubectl: str, directory: Path) -> list[dict]:
    out = subprocess.run([kubectl, "kustomize", str(directory)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"kubectl kustomize {directory}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d is not None]


def is_kubernetes_object(doc: dict) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc and \
        doc["kind"] not in ("Kustomization", "Component")


def for_validation(doc: dict) -> list[dict]:
    """What kubernetes-validate checks for one object: the object itself,
    or, for a Sandbox (a custom resource, whose schema it has not), its pod
    template as a core PodTemplate and its claim templates as claims."""
    if doc.get("kind") != "Sandbox":
        return [doc]
    name = doc["metadata"]["name"]
    spec = doc["spec"]
    template = spec["podTemplate"]
    out = [{
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": f"{name}-pod-template"},
        "template": {"metadata": copy.deepcopy(template.get("metadata", {})),
                     "spec": copy.deepcopy(template["spec"])},
    }]
    for claim in spec.get("volumeClaimTemplates", []):
        out.append({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": copy.deepcopy(claim.get("metadata", {})),
            "spec": copy.deepcopy(claim["spec"]),
        })
    return out


def sandbox_shape_errors(doc: dict) -> list[str]:
    """The fields of a Sandbox outside its pod template and claims, against
    the CRD's: what kubernetes-validate cannot check for want of a schema."""
    errors = []
    if doc.get("apiVersion") != "agents.x-k8s.io/v1alpha1":
        errors.append(f"Sandbox apiVersion {doc.get('apiVersion')!r}")
    spec = doc.get("spec", {})
    errors += [f"Sandbox spec has no field {k!r}" for k in set(spec) - SANDBOX_SPEC_FIELDS]
    if "podTemplate" not in spec:
        errors.append("Sandbox spec has no podTemplate")
        return errors
    template = spec["podTemplate"]
    errors += [f"Sandbox podTemplate has no field {k!r}"
               for k in set(template) - SANDBOX_POD_TEMPLATE_FIELDS]
    errors += [f"Sandbox podTemplate.metadata has no field {k!r} (only labels and annotations are used)"
               for k in set(template.get("metadata", {})) - SANDBOX_POD_METADATA_FIELDS]
    for claim in spec.get("volumeClaimTemplates", []):
        errors += [f"Sandbox volumeClaimTemplates metadata has no field {k!r}"
                   for k in set(claim.get("metadata", {})) - SANDBOX_CLAIM_METADATA_FIELDS]
    replicas = spec.get("replicas", 1)
    if replicas not in (0, 1):
        errors.append(f"Sandbox replicas {replicas} (only 0 and 1 are allowed)")
    return errors


def validate(docs: list[dict], version: str, workdir: Path) -> list[str]:
    """kubernetes-validate --strict over docs (each written to a file of its
    own): the failures, and any object it found no schema for."""
    failures = []
    for i, doc in enumerate(docs):
        path = workdir / f"{i:02d}-{doc['kind'].lower()}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out = subprocess.run(
            [sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet",
             "-k", version, str(path)],
            capture_output=True, text=True, timeout=120)
        text = (out.stdout + out.stderr).strip()
        if out.returncode != 0 or "WARN" in text or "ERROR" in text:
            failures.append(f"{doc['kind']}/{doc.get('metadata', {}).get('name')}: {text}")
    return failures


_SUFFIX = {
    "m": Decimal("0.001"), "": Decimal(1),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40, "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}


def quantity(value) -> Decimal:
    """A Kubernetes resource quantity ("250m", "4Gi", 2) as a number."""
    m = re.fullmatch(r"([0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?", str(value).strip())
    if not m:
        raise ValueError(f"not a quantity: {value!r}")
    return Decimal(m.group(1)) * _SUFFIX[m.group(2) or ""]
