"""The product as users run it, on the real node: the image built from the Dockerfile
(``make image``), installed by the chart in its normal Service mode (2 replicas, the PDB,
probes, restricted security context, no service-account token), reached by kube-apiserver
through the Service, with ``failurePolicy: Fail``; and the node agent in-cluster from the
same image with the chart's RBAC (the session's release, tests/node/conftest.py: one agent
per node, so this release runs none; its profile has a name of its own, so the two
releases' webhooks never reshape the same pods).

Runs before test_real_node.py (file order) and uninstalls everything at the end, so the
density scenarios find the node as they expect. Figures go to build/node-e2e/results.json.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.e2e.cluster import PROFILE_LABEL, SWAP_LABEL, ControlPlane, swapwise_executable
from tests.node.conftest import Agent
from tests.node.incluster import (
    IMAGE_ARCHIVE,
    ImageFacts,
    PodLoad,
    Release,
    failure_message,
    ready,
)
from tests.node.node import GUEST_IP, RealNode

pytestmark = pytest.mark.node

RELEASE, NAMESPACE = "incluster", "swapwise-system"
FULLNAME = f"{RELEASE}-swapwise"
OPTED_IN, PLAIN = "incluster-sandboxes", "incluster-plain"
PROFILE = "incluster"
POLICY_BEFORE: dict[str, Any] = {"swapRatio": 2}
POLICY_AFTER: dict[str, Any] = {"swapRatio": 1}
HOST_PORT = 10260


def chart_version() -> str:
    chart = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts/swapwise/Chart.yaml")
                           .read_text())
    return str(chart["appVersion"])


@pytest.fixture(scope="module")
def image() -> ImageFacts:
    return ImageFacts.read(IMAGE_ARCHIVE)


@pytest.fixture(scope="module")
def release(control_plane: ControlPlane, node: RealNode,
            image: ImageFacts) -> Iterator[Release]:
    """The chart as a user installs it, with the image the node imported at boot."""
    repository, tag = image.name.rsplit(":", 1)
    workdir = control_plane.workdir / "incluster"
    workdir.mkdir(exist_ok=True)
    rel = Release(control_plane, workdir, RELEASE, NAMESPACE, {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "webhook": {"failurePolicy": "Fail", "timeoutSeconds": 10},
        "policy": {"profiles": {"default": None, PROFILE: dict(POLICY_BEFORE)}},
        "nodeAgent": {"enabled": False},
    })
    control_plane.create_namespace(OPTED_IN, {PROFILE_LABEL: PROFILE})
    control_plane.create_namespace(PLAIN)
    rel.upgrade()
    try:
        rel.rollout_status(FULLNAME)
        node.wait_for(lambda: len(rel.endpoints()) == 2, 300,
                      what="both webhook replicas behind the Service")
        yield rel
    finally:
        rel.uninstall()
        for ns in (OPTED_IN, PLAIN, NAMESPACE):
            control_plane.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=300s",
                                  check=False, timeout=330)


def chart_policy(cp: ControlPlane) -> str:
    """The policy file the replicas mount: the chart's ConfigMap."""
    config_map = cp.get_json("configmap", f"{FULLNAME}-policy", "-n", NAMESPACE)
    return str(config_map["data"]["policy.yaml"])


def preview(manifest: dict[str, Any], policy: str, workdir: Path) -> dict[str, Any]:
    """``swapwise preview`` of one pod, profile ``incluster`` of ``policy`` (a policy file)."""
    policy_file = workdir / "preview-policy.yaml"
    policy_file.write_text(policy)
    source = workdir / "preview-pod.json"
    source.write_text(json.dumps(manifest))
    out = subprocess.run([swapwise_executable(), "preview", "-f", str(source), "--policy",
                          str(policy_file), "--profile", PROFILE, "-o", "json"],
                         capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def memory_request(pod: dict[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["resources"]["requests"]["memory"])


def gated_pod(name: str, namespace: str, memory: str = "512Mi") -> dict[str, Any]:
    resources = {"cpu": "20m", "memory": memory}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {
            "schedulingGates": [{"name": "swapwise.io/test-hold"}],
            "automountServiceAccountToken": False,
            "containers": [{"name": "app", "image": "localhost/swapwise/pause:v1",
                            "resources": {"requests": dict(resources),
                                          "limits": dict(resources)}}],
        },
    }


def served_certificate(address: str, port: int) -> x509.Certificate:
    """The certificate a webhook replica serves right now (pod IPs are routed here)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((address, port), timeout=10) as sock, \
            context.wrap_socket(sock) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def report_load(results: dict[str, Any], key: str, load: PodLoad) -> None:
    results[f"{key}.creates"] = load.creates
    results[f"{key}.failures"] = len(load.failures)
    results[f"{key}.creates_per_s"] = round(load.achieved_rate, 2)
    results[f"{key}.seconds"] = round(load.elapsed, 1)
    print(f"\n{key}: {load.creates} creates in {load.elapsed:.0f}s "
          f"({load.achieved_rate:.1f}/s), {len(load.failures)} failed")


def assert_clean(load: PodLoad) -> None:
    assert load.achieved_rate >= 5, f"the client managed only {load.achieved_rate:.1f} pods/s"
    assert not load.failures, f"{len(load.failures)} failed admissions:\n" + "\n".join(
        load.failures[:10])
    assert load.not_reshaped == 0


def delete_load(cp: ControlPlane) -> None:
    cp.kubectl("delete", "pods", "--all", "-n", OPTED_IN, "--wait=false", timeout=300)


# --------------------------------------------------------------------------- scenarios


def test_image_facts(control_plane: ControlPlane, node: RealNode, release: Release,
                     image: ImageFacts, results: dict[str, Any]) -> None:
    """UID 65532, read-only root filesystem, and the version the chart says."""
    assert image.user == "65532:65532"
    assert image.entrypoint == ["swapwise", "serve"]
    results["image.size_bytes"] = image.layers_bytes
    results["image.compressed_bytes"] = image.compressed_bytes
    # The image's own user (no runAsUser here) and its version, from the node's containerd.
    facts = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "image-facts", "namespace": PLAIN},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "facts", "image": image.name, "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "id -u; swapwise --version"],
                "securityContext": {"readOnlyRootFilesystem": True},
            }],
        },
    }
    control_plane.apply(json.dumps(facts))
    node.wait_for(
        lambda: control_plane.get_json("pod", "image-facts", "-n", PLAIN)["status"].get("phase")
        in ("Succeeded", "Failed"), 600, what="the image-facts pod to finish")
    out = control_plane.kubectl("logs", "image-facts", "-n", PLAIN).stdout.split()
    assert out == ["65532", "swapwise", chart_version()], out
    results["image.uid"] = int(out[0])
    # The chart's replicas run with a read-only root filesystem and no token, and serve.
    for pod in release.pods():
        assert ready(pod)
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        (container,) = spec["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["image"] == image.name
        assert not any(v.get("projected") for v in spec.get("volumes", []))
    assert control_plane.get_json("pdb", FULLNAME, "-n", NAMESPACE)["status"][
        "currentHealthy"] == 2


def test_node_agent_in_cluster_labels_the_swap_node(control_plane: ControlPlane,
                                                     node: RealNode, agent: Agent,
                                                     image: ImageFacts) -> None:
    """The node agent, a DaemonSet pod of the same image on the node, with the chart's RBAC
    (nodes get/list/watch/patch, nodes/configz; never nodes/proxy), reads the kubelet's
    configz and labels the node."""

    def labelled() -> bool:
        meta = node.node()["metadata"]
        return bool(meta.get("labels", {}).get(SWAP_LABEL) == "true" and meta.get(
            "annotations", {}).get("swapwise.io/swap-node", "").startswith("true"))

    node.wait_for(labelled, 300, what="the in-cluster node agent to label the node")
    pod = agent.pod()
    assert pod is not None and pod["spec"]["nodeName"] == node.name
    (container,) = pod["spec"]["containers"]
    assert container["image"] == image.name
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    granted = json.dumps([control_plane.get_json("clusterroles", "-l",
                                                 "app.kubernetes.io/name=swapwise")["items"]])
    assert "nodes/proxy" not in granted


def test_reshaped_in_cluster_equals_preview(control_plane: ControlPlane, release: Release,
                                            tmp_path: Path) -> None:
    """The stored pod is what ``swapwise preview`` gives for the same manifest and policy
    (both stored by the same API server, so defaulting is the same on each side)."""
    manifest = gated_pod("same-as-preview", OPTED_IN, memory="768Mi")
    control_plane.kubectl("create", "-f", "-", input=json.dumps(manifest))
    stored = control_plane.get_json("pod", "same-as-preview", "-n", OPTED_IN)
    expected = preview(manifest, chart_policy(control_plane), tmp_path)
    expected["metadata"]["namespace"] = PLAIN  # not opted in: stored as previewed
    out = control_plane.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                                input=json.dumps(expected))
    previewed = json.loads(out.stdout)
    assert stored["spec"] == previewed["spec"]
    assert stored["metadata"]["annotations"] == previewed["metadata"]["annotations"]
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] != resources["limits"]["memory"]


def test_upgrade_rolls_with_zero_failed_admissions(control_plane: ControlPlane,
                                                   release: Release, tmp_path: Path,
                                                   results: dict[str, Any]) -> None:
    """helm upgrade that changes the policy and rolls the Deployment, while a client keeps
    creating pods; failurePolicy Fail, so any unanswered admission is a failed create."""
    before = {p["metadata"]["uid"] for p in release.pods()}
    manifest = gated_pod("x", OPTED_IN, memory=PodLoad.memory)
    old_request = memory_request(preview(manifest, chart_policy(control_plane), tmp_path))
    with PodLoad(control_plane, OPTED_IN) as load:
        release.upgrade({
            "policy": {"profiles": {"default": None, PROFILE: dict(POLICY_AFTER)}},
            "podAnnotations": {"swapwise.io/test-rollout": "2"},
        })
        release.rollout_status(FULLNAME)
        release.cp.kubectl("wait", "--for=delete", "pod", "-n", NAMESPACE, "--timeout=300s",
                           *[p["metadata"]["name"] for p in release.pods()
                             if p["metadata"]["uid"] in before], check=False, timeout=330)
        # The new replicas answer with the new policy before the client stops.
        want_request = memory_request(preview(manifest, chart_policy(control_plane), tmp_path))
        release.cp.wait_for(lambda: load.requests[-20:].count(want_request) == 20
                            if len(load.requests) >= 20 else False,
                            timeout=300, what="20 creates in a row with the new policy")
    report_load(results, "upgrade", load)
    after = {p["metadata"]["uid"] for p in release.pods()}
    assert after and not after & before, "the Deployment did not roll"
    assert load.requests[0] == old_request != want_request
    assert_clean(load)
    delete_load(control_plane)


@dataclass(frozen=True)
class Kill:
    """One replica signalled under load: the load, the victim's pod IP, and the monotonic
    times from just before the signal to both endpoints serving again."""

    load: PodLoad
    ip: str
    signalled: float
    recovered: float


def kill_one_replica_under_load(cp: ControlPlane, node: RealNode, release: Release,
                                signal: str) -> Kill:
    """Signal one webhook container from the node while the client creates pods; wait
    until it has restarted, is ready and both endpoints serve again."""
    victim = release.pods()[0]
    name, ip = victim["metadata"]["name"], victim["status"]["podIP"]
    restarts = victim["status"]["containerStatuses"][0]["restartCount"]
    container_id = victim["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]

    def back() -> bool:
        pod = cp.get_json("pod", name, "-n", NAMESPACE)
        return bool(pod["status"]["containerStatuses"][0]["restartCount"] > restarts
                    and ready(pod))

    with PodLoad(cp, OPTED_IN) as load:
        cp.wait_for(lambda: load.creates >= 10, 120, what="the load to start")
        signalled = time.monotonic()
        node.kill_container(container_id, signal)
        node.wait_for(back, 600, what=f"{name} to restart and be ready again")
        node.wait_for(lambda: len(release.endpoints()) == 2, 300, what="both endpoints again")
        recovered = time.monotonic()
        start = load.creates
        cp.wait_for(lambda: load.creates >= start + 20, 120, what="20 more creates")
    delete_load(cp)
    return Kill(load, ip, signalled, recovered)


def test_replica_stopped_with_zero_failed_admissions(control_plane: ControlPlane,
                                                    node: RealNode, release: Release,
                                                    results: dict[str, Any]) -> None:
    """One replica's container is stopped from the node (SIGTERM, as ``crictl stop`` or a
    node shutting down does: no pod deletion, no preStop). It drains for longer than its
    readiness probe takes to withdraw the endpoint, so no admission fails."""
    kill = kill_one_replica_under_load(control_plane, node, release, "SIGTERM")
    report_load(results, "replica_kill", kill.load)
    results["replica_kill.signal"] = "SIGTERM"
    assert_clean(kill.load)


def lost_to_the_kill(message: str, ip: str) -> bool:
    """Whether a failed webhook call's message is one a SIGKILLed replica causes: its
    endpoint refused a dial or reset a connection, or a connection closed before any
    answer (Go's ``Post "...": EOF``, which names no endpoint: the kernel sends FIN, not
    RST, when the killed process had already read the whole request)."""
    on_victim = f"->{ip}:" in message or f"dial tcp {ip}:" in message
    socket_error = "connection refused" in message or "connection reset" in message
    return (on_victim and socket_error) or message.endswith('": EOF')


_CALL = ('failed calling webhook "incluster.swapwise.io": failed to call webhook: Post '
         '"https://incluster-swapwise.swapwise-system.svc:443/mutate/incluster?timeout=10s": ')


@pytest.mark.parametrize(("message", "lost"), [
    # Seen on CI: the killed replica reset the API server's connection.
    (_CALL + "read tcp 10.0.2.2:45414->10.244.0.8:8443: read: connection reset by peer", True),
    (_CALL + "dial tcp 10.244.0.8:8443: connect: connection refused", True),
    (_CALL + "EOF", True),
    # The surviving replica, or anything other than a dead socket, is not the kill's loss.
    (_CALL + "dial tcp 10.244.0.9:8443: connect: connection refused", False),
    (_CALL + "read tcp 10.0.2.2:45414->10.244.0.80:8443: read: connection reset by peer", False),
    (_CALL + "context deadline exceeded", False),
    ('admission webhook "incluster.swapwise.io" denied the request: no', False),
])
def test_a_kills_losses_are_told_from_other_failures(message: str, lost: bool) -> None:
    status = json.dumps({"kind": "Status", "message": "Internal error occurred: " + message})
    assert lost_to_the_kill(failure_message(status), "10.244.0.8") is lost


def test_replica_sigkilled_loses_only_what_was_on_it(control_plane: ControlPlane,
                                                    node: RealNode, release: Release,
                                                    results: dict[str, Any]) -> None:
    """SIGKILL (an OOM kill, a crash): nothing can drain. kube-apiserver does not retry a
    webhook call, so an admission on the dead replica's connection, or dialled to its
    endpoint in the second or two before the kubelet reports it, fails (failurePolicy
    Fail). Measured and reported; asserted: every failure is one of those, happened
    between the signal and the replica serving again, and they are few."""
    kill = kill_one_replica_under_load(control_plane, node, release, "SIGKILL")
    load = kill.load
    report_load(results, "replica_sigkill", load)
    assert load.achieved_rate >= 5
    assert load.not_reshaped == 0
    for failure, at in zip(load.failures, load.failed_at, strict=True):
        assert lost_to_the_kill(failure, kill.ip), failure
        assert kill.signalled <= at <= kill.recovered, (
            f"failed {at - kill.signalled:.1f}s after the signal, outside the "
            f"{kill.recovered - kill.signalled:.1f}s until both endpoints served: {failure}")
    assert len(load.failures) <= 10, load.failures


def test_certificate_rotation_in_cluster(control_plane: ControlPlane, node: RealNode,
                                         release: Release, tmp_path: Path,
                                         results: dict[str, Any]) -> None:
    """certs.mode secret: the documented rotation (trust both CAs, replace the Secret, drop
    the old CA). The kubelet updates the mounted files, the replicas reload them, and pod
    creation never fails across it."""
    secret = f"{FULLNAME}-serving"

    def make_certs(out: Path) -> tuple[Path, bytes]:
        subprocess.run([swapwise_executable(), "certs", "--service", FULLNAME, "--namespace",
                        NAMESPACE, "--out", str(out)], check=True, capture_output=True)
        return out, (out / "ca.crt").read_bytes()

    def secret_manifest(certs: Path) -> str:
        out = control_plane.kubectl("create", "secret", "tls", secret, "-n", NAMESPACE,
                                    f"--cert={certs / 'tls.crt'}", f"--key={certs / 'tls.key'}",
                                    "--dry-run=client", "-o", "json")
        return out.stdout

    def serving(certs: Path) -> bool:
        want = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).serial_number
        endpoints = release.endpoints()
        return len(endpoints) == 2 and all(
            served_certificate(a, p).serial_number == want for a, p in endpoints)

    old, old_ca = make_certs(tmp_path / "old")
    new, new_ca = make_certs(tmp_path / "new")
    # Switch to secret mode (not under load: the selfSigned CA is not in this caBundle).
    control_plane.apply(secret_manifest(old))
    release.upgrade({"certs": {"mode": "secret", "secretName": secret,
                               "caBundle": old_ca.decode()}})
    release.rollout_status(FULLNAME)
    node.wait_for(lambda: serving(old), 600, what="both replicas serving the first certificate")

    with PodLoad(control_plane, OPTED_IN) as load:
        release.upgrade({"certs": {"caBundle": (old_ca + new_ca).decode()}})
        control_plane.kubectl("replace", "-f", "-", input=secret_manifest(new))
        node.wait_for(lambda: serving(new), 600,
                      what="both replicas serving the new certificate (no restart)")
        release.upgrade({"certs": {"caBundle": new_ca.decode()}})
        start = load.creates
        release.cp.wait_for(lambda: load.creates >= start + 20, 120, what="20 more creates")
    report_load(results, "rotation", load)
    restarts = [s["restartCount"] for p in release.pods() for s in p["status"][
        "containerStatuses"]]
    assert restarts == [0, 0], "the certificate was reloaded, not restarted into"
    assert_clean(load)
    delete_load(control_plane)


def test_host_network_mode(control_plane: ControlPlane, node: RealNode, release: Release,
                           results: dict[str, Any]) -> None:
    """hostNetwork: for API servers that cannot reach pod IPs. The Service's endpoint is the
    node's own address and port, and admission works through it."""
    release.upgrade({"hostNetwork": {"enabled": True, "port": HOST_PORT}, "replicaCount": 1})
    release.rollout_status(FULLNAME)
    node.wait_for(lambda: release.endpoints() == [(GUEST_IP, HOST_PORT)], 300,
                  what=f"the Service's endpoint to be {GUEST_IP}:{HOST_PORT}")
    control_plane.apply(json.dumps(gated_pod("via-host-network", OPTED_IN)))
    stored = control_plane.get_json("pod", "via-host-network", "-n", OPTED_IN)
    resources = stored["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] != resources["limits"]["memory"]
    assert stored["metadata"]["annotations"][PROFILE_LABEL] == PROFILE
