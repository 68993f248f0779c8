"""swapwise installed the way users install it: ``helm install`` of charts/swapwise.

With no kubelet to run the webhook's Deployment, the chart is installed in ``webhook.url``
mode pointing at 127.0.0.1, and ``swapwise serve`` runs on loopback with exactly what the
pod would mount: the chart's TLS Secret and policy ConfigMap, read back from the cluster.
So the webhook configuration, certificates and policy the API server uses are all the
chart's own.
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import (
    PROFILE_LABEL,
    ClusterError,
    ControlPlane,
    Swapwise,
    free_port,
    wait_for_mutation,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "swapwise"
RELEASE = "swapwise"
NAMESPACE = "swapwise"


def declared_backing(profile: Any) -> Any:
    """The profile with its swap backing said: the webhook's default, ``required``, unless it
    says otherwise. The chart, installed here without its node agent (no kubelet would run
    it), would otherwise turn backing off (fake nodes carry the per-mille label the agent
    writes, as tests/e2e/conftest.py makes them); tests/chart checks that choice of the
    chart's."""
    if not isinstance(profile, dict):
        return profile
    placement = profile.get("placement") or {}
    if "swapBacking" in placement:
        return profile
    return {**profile, "placement": {**placement, "swapBacking": "required"}}


class Installation:
    """A helm release of the chart plus the local ``swapwise serve`` it points at."""

    def __init__(self, cp: ControlPlane, workdir: Path, profiles: dict[str, Any],
                 values: dict[str, Any] | None = None) -> None:
        self.cp = cp
        self.workdir = workdir
        self.port = free_port()
        # The chart's own `default` profile would be merged in by Helm; drop it (null).
        # ``values``: more sections (tests/node turns the node agent on, with its image).
        self.values: dict[str, Any] = {
            "policy": {"profiles": {"default": None, **{
                name: declared_backing(p) for name, p in profiles.items()}}},
            "webhook": {"url": f"https://127.0.0.1:{self.port}", "failurePolicy": "Ignore"},
            # No kubelet runs its pods, and its DaemonSet's would take room on the fake nodes
            # the placement tests count (tests/e2e/test_node_agent_privilege.py installs it).
            "nodeAgent": {"enabled": False},
            **(values or {}),
        }
        self.server: Swapwise | None = None

    # -- helm

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.cp.helm), "--kubeconfig", str(self.cp.kubeconfig), *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if check and proc.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} failed:\n{proc.stderr}{proc.stdout}")
        return proc

    def upgrade(self, **sections: dict[str, Any]) -> None:
        """``helm upgrade --install``; each keyword replaces fields of that values section."""
        for section, fields in sections.items():
            self.values.setdefault(section, {}).update(fields)
        values_file = self.workdir / "values.yaml"
        values_file.write_text(yaml.safe_dump(self.values))
        self.helm(
            "upgrade",
            "--install",
            RELEASE,
            str(CHART),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "--values",
            str(values_file),
        )

    def webhook_configuration(self) -> dict[str, Any]:
        config: dict[str, Any] = self.cp.get_json("mutatingwebhookconfiguration", RELEASE)
        return config

    def tls_secret(self) -> dict[str, bytes]:
        secret = self.cp.get_json("secret", f"{RELEASE}-tls", "-n", NAMESPACE)
        return {k: base64.b64decode(v) for k, v in secret["data"].items()}

    # -- the server, fed with what the chart rendered

    def write_mounts(self) -> tuple[Path, Path]:
        """The Secret and ConfigMap as files, like the pod's volume mounts."""
        cert_dir = self.workdir / "tls"
        cert_dir.mkdir(parents=True, exist_ok=True)
        for name, content in self.tls_secret().items():
            (cert_dir / name).write_bytes(content)
        (cert_dir / "tls.key").chmod(0o600)
        config_map = self.cp.get_json("configmap", f"{RELEASE}-policy", "-n", NAMESPACE)
        policy = self.workdir / "policy" / "policy.yaml"
        policy.parent.mkdir(parents=True, exist_ok=True)
        policy.write_text(config_map["data"]["policy.yaml"])
        return cert_dir, policy

    def start_server(self) -> Swapwise:
        cert_dir, policy = self.write_mounts()
        server = Swapwise(self.workdir / "server", policy=policy, port=self.port, cert_dir=cert_dir)
        server.start()
        self.server = server
        return server

    def stop_server(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def wait_for_failure_policy(self, policy: str, timeout: float = 30) -> None:
        """Wait until the new configuration is stored (the API server picks it up next)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hooks = self.webhook_configuration()["webhooks"]
            if all(h["failurePolicy"] == policy for h in hooks):
                return
            time.sleep(0.2)
        raise ClusterError(f"webhook failurePolicy never became {policy}")


@contextlib.contextmanager
def installed(
    cp: ControlPlane, workdir: Path, profiles: dict[str, Any],
    opted_in: tuple[str, str] | None = None,
) -> Iterator[Installation]:
    """The chart installed with these profiles and its server running; uninstalled after.

    ``opted_in``: (namespace, profile) to create labelled for that profile, returned only
    once the webhook reshapes pods there.
    """
    install = Installation(cp, workdir, profiles)
    install.upgrade()
    try:
        install.start_server()
        if opted_in is not None:
            namespace, profile = opted_in
            cp.create_namespace(namespace, {PROFILE_LABEL: profile})
            wait_for_mutation(cp, namespace)
        yield install
    finally:
        install.stop_server()
        install.helm("uninstall", RELEASE, "--namespace", NAMESPACE, check=False)


def pod(name: str, namespace: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"containers": list(containers), **spec},
    }


def container(
    name: str = "app", memory: str = "2Gi", cpu: str = "100m", guaranteed: bool = True, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {"memory": memory, "cpu": cpu}}
    if guaranteed:
        resources["requests"] = {"memory": memory, "cpu": cpu}
    return {"name": name, "image": "registry.k8s.io/pause:3.10", "resources": resources, **extra}


def manifest(*objects: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
