"""The chart installed and upgraded by the Helm SWAPWISE_HELM selects (3 or 4).

Helm 4 applies a release's objects server-side (``--server-side=auto``: true for a new
release, then what the release used), Helm 3 with client-side three-way merges. Either way an
upgrade must leave exactly the objects and fields the new values render: a profile taken out
of the values loses its webhook entry.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.cluster import HELM_MAJOR, ControlPlane
from tests.e2e.install import RELEASE, Installation

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]


def test_install_and_upgrade_with_the_selected_helm(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    version = subprocess.run([str(control_plane.helm), "version", "--template={{.Version}}"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert version.startswith(f"v{HELM_MAJOR}.")
    install = Installation(control_plane, tmp_path, {"a": {"swapRatio": 2}, "b": {}})
    try:
        install.upgrade()
        config = control_plane.get_json("mutatingwebhookconfiguration", RELEASE,
                                        "--show-managed-fields")
        assert [h["name"] for h in config["webhooks"]] == ["a.swapwise.io", "b.swapwise.io"]
        managers = {(m["manager"], m["operation"]) for m in config["metadata"]["managedFields"]}
        assert managers == {("helm", "Apply" if HELM_MAJOR == "4" else "Update")}
        ca = install.tls_secret()["ca.crt"]
        policy = control_plane.get_json("configmap", f"{RELEASE}-policy", "-n", "swapwise")
        assert "\n  b:" in policy["data"]["policy.yaml"]

        install.upgrade(policy={"profiles": {"default": None, "a": {"swapRatio": 2}}})
        config = install.webhook_configuration()
        assert [h["name"] for h in config["webhooks"]] == ["a.swapwise.io"]
        policy = control_plane.get_json("configmap", f"{RELEASE}-policy", "-n", "swapwise")
        assert "\n  b:" not in policy["data"]["policy.yaml"]
        assert install.tls_secret()["ca.crt"] == ca  # lookup kept the self-signed CA
        history = install.helm("history", RELEASE, "--namespace", "swapwise", "-o", "json")
        assert '"revision":2' in history.stdout.replace(" ", "")
    finally:
        install.helm("uninstall", RELEASE, "--namespace", "swapwise", check=False)
    gone = control_plane.kubectl("get", "mutatingwebhookconfiguration", RELEASE, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
