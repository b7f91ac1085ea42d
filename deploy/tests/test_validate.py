"""Every manifest, as written and as kustomize renders it, against the
Kubernetes API's schemas (kubernetes-validate --strict: no field the API
does not have) of the oldest and the newest release docs/deploy.md names.
The Sandbox, a custom resource, is checked through its pod template and
claims, and its own fields against the CRD's."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import manifests
import policy

VERSIONS = manifests.k8s_versions()
KUSTOMIZATIONS = sorted(manifests.KUSTOMIZATIONS)


def manifest_files() -> list[Path]:
    """The files under deploy/ that hold Kubernetes objects (not
    kustomizations, kustomize configurations or Helm values)."""
    files = []
    for path in sorted(manifests.DEPLOY.rglob("*.yaml")):
        docs = manifests.load_all(path)
        if docs and all(manifests.is_kubernetes_object(d) for d in docs):
            files.append(path)
    return files


FILES = manifest_files()


def test_the_manifest_files_are_found():
    names = {str(p.relative_to(manifests.DEPLOY)) for p in FILES}
    assert {"k8s/base/statefulset.yaml", "k8s/base/service.yaml",
            "k8s/base/networkpolicy.yaml", "k8s/base/namespace.yaml",
            "k8s/sandbox/sandbox.yaml", "k8s/sandbox/store-claim.yaml",
            "kata/runtimeclass.yaml"} <= names


def test_every_kustomization_is_known(kustomizations):
    # A new kustomization is added to manifests.KUSTOMIZATIONS, and to
    # RUNC_KUSTOMIZATIONS if its pod runs without a VM.
    assert set(kustomizations) == manifests.KUSTOMIZATIONS


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(manifests.DEPLOY)))
def test_manifest_file_validates(path, version, tmp_path):
    docs = [v for d in manifests.load_all(path) for v in manifests.for_validation(d)]
    assert manifests.validate(docs, version, tmp_path) == []


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_rendered_kustomization_validates(rendered, name, version, tmp_path):
    docs = [v for d in rendered[name] for v in manifests.for_validation(d)]
    assert docs
    assert manifests.validate(docs, version, tmp_path) == []


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_rendered_sandboxes_have_only_the_crds_fields(rendered, name):
    for d in rendered[name]:
        if d["kind"] == "Sandbox":
            assert manifests.sandbox_shape_errors(d) == []


@pytest.mark.parametrize("version", VERSIONS[:1])
def test_validation_fails_on_a_field_the_api_lacks(rendered, version, tmp_path):
    # The check above can fail: --strict refuses an unknown field, and an
    # object without a schema is a failure, not a pass.
    docs = copy.deepcopy([d for d in rendered["base"] if d["kind"] == "StatefulSet"])
    docs[0]["spec"]["template"]["spec"]["containers"][0]["privilegd"] = True
    failures = manifests.validate(docs, version, tmp_path)
    assert len(failures) == 1 and "privilegd" in failures[0]
    sandbox = [d for d in rendered["sandbox"] if d["kind"] == "Sandbox"]
    assert "Couldn't find schema" in manifests.validate(sandbox, version, tmp_path)[0]


def test_a_sandbox_field_the_crd_lacks_is_reported(rendered):
    sandbox = copy.deepcopy(next(d for d in rendered["sandbox"] if d["kind"] == "Sandbox"))
    sandbox["spec"]["volumeClaimTemplate"] = []
    sandbox["spec"]["podTemplate"]["metadata"]["name"] = "x"
    sandbox["spec"]["replicas"] = 2
    errors = manifests.sandbox_shape_errors(sandbox)
    assert len(errors) == 3, errors


def with_claim_template(docs: list[dict]) -> list[dict]:
    """The sandbox's output with its store claim moved into the Sandbox's
    volumeClaimTemplates, the CRD's other way to hold it (the controller
    then adds the `store` volume itself)."""
    docs = copy.deepcopy(docs)
    pvc = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    docs.remove(pvc)
    box = next(d for d in docs if d["kind"] == "Sandbox")
    pod = box["spec"]["podTemplate"]["spec"]
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "store"]
    box["spec"]["volumeClaimTemplates"] = [
        {"metadata": {"name": "store", "labels": pvc["metadata"]["labels"]}, "spec": pvc["spec"]}]
    return docs


@pytest.mark.parametrize("version", VERSIONS)
def test_a_sandboxs_claim_templates_are_validated_as_claims(rendered, version, tmp_path):
    docs = with_claim_template(rendered["sandbox"])
    box = next(d for d in docs if d["kind"] == "Sandbox")
    extracted = manifests.for_validation(box)
    assert [d["kind"] for d in extracted] == ["PodTemplate", "PersistentVolumeClaim"]
    assert manifests.sandbox_shape_errors(box) == []
    assert manifests.validate(extracted, version, tmp_path) == []
    extracted[1]["spec"]["volumeMod"] = "Block"
    assert "volumeMod" in manifests.validate(extracted[1:], version, tmp_path)[0]


def test_the_rules_hold_for_a_sandbox_with_a_claim_template(rendered):
    docs = with_claim_template(rendered["sandbox"])
    assert policy.violations(docs) == []
    next(d for d in docs if d["kind"] == "Sandbox")["spec"]["volumeClaimTemplates"][0][
        "spec"]["volumeMode"] = "Filesystem"
    assert any("volumeMode" in v for v in policy.violations(docs))
