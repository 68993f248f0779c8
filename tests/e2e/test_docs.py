"""The docs' cluster commands, run in order against a fresh local control plane per doc.

What differs from a user's cluster, and how the commands are adapted (nothing else is):
- no kubelet runs the image, so `helm install`/`upgrade` get `--set webhook.url=...` and
  `swapwise serve` runs on loopback with the chart's own Secret and policy ConfigMap (as in
  tests/e2e/install.py), restarted after each install/upgrade and stopped by `helm uninstall`;
- `REGISTRY` is `registry.example` (nothing is pulled);
- commands whose output is checked are retried for a few seconds, since the API server
  takes a moment to see a new namespace label or webhook configuration.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from testkit import docs
from tests.e2e.cluster import (
    ControlPlane,
    Swapwise,
    ensure_binaries,
    free_port,
    skip_unless_e2e,
)

pytestmark = pytest.mark.e2e

RELEASE = "swapwise"  # the release name every doc uses; objects are named after it
CLUSTER_DOCS = [
    name for name in docs.DOCS
    if any(docs.rule_for(c).where == docs.CLUSTER for c in docs.load(name).commands)
]


class Session:
    """A user's shell on one doc: its directory, kubeconfig and the webhook the chart names."""

    def __init__(self, cp: ControlPlane, cwd: Path) -> None:
        self.cp, self.cwd = cp, cwd
        self.port = free_port()
        # `helm` in the docs is the Helm this session selects (SWAPWISE_HELM: 3 or helm4).
        shims = cwd / "shims"
        shims.mkdir(parents=True, exist_ok=True)
        (shims / "helm").unlink(missing_ok=True)
        (shims / "helm").symlink_to(cp.helm)
        self.env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig),
                    "PATH": f"{shims}:{cp.bin}:{os.environ['PATH']}"}
        self.server: Swapwise | None = None

    def adapt(self, command: docs.Command) -> str:
        text = command.text.replace("REGISTRY", docs.REGISTRY)
        if re.match(r"helm (install|upgrade)", command.words):
            words = shlex.split(text.replace("\\\n", " "), comments=True)
            text = shlex.join([*words, "--set", f"webhook.url=https://127.0.0.1:{self.port}"])
        return text

    def run(self, command: docs.Command) -> subprocess.CompletedProcess[str]:
        cwd = docs.REPO if command.words == "make demo" else self.cwd
        return subprocess.run(["bash", "-euo", "pipefail", "-c", self.adapt(command)], cwd=cwd,
                              env=self.env, capture_output=True, text=True, timeout=900,
                              check=False)

    def serve_release(self, namespace: str) -> None:
        """(Re)start the webhook with the files the chart's pod would mount."""
        self.stop()
        secret = self.cp.get_json("secret", f"{RELEASE}-tls", "-n", namespace)
        tls = self.cwd / "mounts" / "tls"
        tls.mkdir(parents=True, exist_ok=True)
        for key, value in secret["data"].items():
            (tls / key).write_bytes(base64.b64decode(value))
        (tls / "tls.key").chmod(0o600)
        config_map = self.cp.get_json("configmap", f"{RELEASE}-policy", "-n", namespace)
        policy = self.cwd / "mounts" / "policy.yaml"
        policy.write_text(config_map["data"]["policy.yaml"])
        self.server = Swapwise(self.cwd / "mounts" / "server", policy=policy, port=self.port,
                               cert_dir=tls)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=0)
            self.server = None


def namespace_of(words: str) -> str:
    found = re.search(r"(?:-n|--namespace) (\S+)", words)
    assert found, f"no namespace in {words!r}"
    return found.group(1)


def checked(session: Session, command: docs.Command) -> None:
    where = f"{command.doc}:{command.line}: {command.words}"
    patient = command.expected is not None or "--dry-run=server" in command.words
    deadline = time.monotonic() + (30 if patient else 0)
    while True:
        out = session.run(command)
        problem = "" if out.returncode == 0 else f"exit {out.returncode}"
        if not problem and command.expected is not None:
            missing = docs.missing_output(command.expected, out.stdout, out.stderr)
            problem = f"not in the output: {missing}" if missing else ""
        if not problem and command.words == "make demo":
            missing = docs.missing_output(
                ("memory: 683Mi",  # the pod's YAML, then kubectl's warnings
                 "Warning: swapwise: sandbox memory request 2Gi -> 683Mi (limit 2Gi)"),
                out.stdout, out.stderr)
            problem = f"not in the output: {missing}" if missing else ""
        if not problem or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not problem, f"{where}: {problem}\n{out.stderr}\n{out.stdout}"


@pytest.mark.parametrize("name", CLUSTER_DOCS)
def test_cluster_commands(name: str, tmp_path: Path) -> None:
    skip_unless_e2e()
    doc = docs.load(name)
    for linked in ("examples", "charts"):
        (tmp_path / linked).symlink_to(docs.REPO / linked)
    for file_name, content in doc.files.items():
        (tmp_path / file_name).write_text(content)
    with ControlPlane(ensure_binaries()) as cp:
        session = Session(cp, tmp_path)
        try:
            for command in doc.commands:
                if docs.rule_for(command).where != docs.CLUSTER:
                    continue
                checked(session, command)
                if re.match(r"helm (install|upgrade)", command.words):
                    session.serve_release(namespace_of(command.words))
                elif command.words.startswith("helm uninstall"):
                    session.stop()
                    assert not cp.kubectl("get", "mutatingwebhookconfigurations",
                                          "-o", "name").stdout.strip()
        finally:
            session.stop()
