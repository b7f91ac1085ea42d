"""Fixtures: a copy of deploy/ with the gateway's token file, the kubectl
that renders it, and every kustomization rendered once.

Run by scripts/test-manifests.sh, which finds or fetches kubectl and
passes it as ALLOX_KUBECTL_BIN.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess

import pytest

import manifests


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = os.environ.get("ALLOX_KUBECTL_BIN")
    if not path:
        pytest.fail("ALLOX_KUBECTL_BIN is not set: run the tests with scripts/test-manifests.sh, "
                    "or set it to a kubectl (1.32 or newer)")
    out = subprocess.run([path, "version", "--client"], capture_output=True, text=True)
    assert out.returncode == 0, f"{path} version --client: {out.stderr}"
    return path


@pytest.fixture(scope="session")
def deploy_copy(tmp_path_factory):
    """deploy/ copied, with base/gateway.env made as docs/deploy.md says
    (token=64 hex digits). The repository never holds that file."""
    root = tmp_path_factory.mktemp("deploy") / "deploy"
    shutil.copytree(manifests.DEPLOY, root,
                    ignore=shutil.ignore_patterns("__pycache__", "gateway.env"))
    env = root / "k8s" / "base" / "gateway.env"
    env.write_text(f"token={secrets.token_hex(32)}\n")
    env.chmod(0o600)
    return root


@pytest.fixture(scope="session")
def kustomizations(deploy_copy) -> dict:
    return manifests.kustomization_dirs(deploy_copy / "k8s")


@pytest.fixture(scope="session")
def rendered(kubectl, kustomizations) -> dict[str, list[dict]]:
    return {name: manifests.render(kubectl, path) for name, path in kustomizations.items()}


@pytest.fixture(scope="session")
def versions() -> tuple[str, str]:
    return manifests.k8s_versions()
