"""What the repository holds and does not hold under deploy/."""

from __future__ import annotations

import subprocess

import manifests


def test_the_token_file_is_never_in_the_repository():
    assert not (manifests.DEPLOY / "k8s" / "base" / "gateway.env").exists() or \
        subprocess.run(["git", "-C", str(manifests.REPO), "check-ignore", "-q",
                        "deploy/k8s/base/gateway.env"]).returncode == 0
    ignore = (manifests.DEPLOY / "k8s" / "base" / ".gitignore").read_text().split()
    assert "gateway.env" in ignore
    tracked = subprocess.run(["git", "-C", str(manifests.REPO), "ls-files", "deploy"],
                             capture_output=True, text=True)
    if tracked.returncode == 0:
        assert not any(p.endswith("gateway.env") for p in tracked.stdout.split())


def test_the_docs_say_how_to_make_the_token_and_set_the_image():
    text = manifests.DOCS.read_text()
    assert "gateway.env" in text and "token=" in text
    assert "kustomize edit set image allox=" in text
    assert "## Tested here" in text


def test_base_names_the_image_by_a_placeholder_digest():
    kust = manifests.load_all(manifests.DEPLOY / "k8s" / "base" / "kustomization.yaml")[0]
    (image,) = kust["images"]
    assert image["name"] == "allox" and image["digest"] == "sha256:" + "0" * 64
