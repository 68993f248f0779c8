"""The chart in mode admissionPolicy, installed with helm on a real kube-apiserver of the
session's line (v1beta1 behind its feature gate on 1.34, v1 on 1.37).

What a user does (README "Without a webhook"): render a values file from a policy file with
`swapwise render admission-policy --format helm-values`, `helm install` the chart with it.
No swapwise server runs anywhere in this test: the API server reshapes the pods itself.
The stored pod must be what the engine gives (the rendered policies are proven equal to it
case by case in tests/e2e/test_admission_policy.py); `kubectl create --dry-run=server` must
show the warning; `helm uninstall` must take the policies away, and with them the mutation.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.e2e.admission_api import API_VERSION
from tests.e2e.cluster import PROFILE_LABEL, ControlPlane
from webhook.engine import mutate_pod
from webhook.policy import build_policy

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]

CHART = Path(__file__).resolve().parents[2] / "charts" / "swapwise"
SWAPWISE = str(Path(sys.executable).with_name("swapwise"))
RELEASE, NAMESPACE = "swapwise", "swapwise"
POLICY = {
    "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
    "profiles": {"sandbox": {
        "swapRatio": 2, "minRequest": "64Mi",
        "placement": {"tolerations": [{"key": "swap", "operator": "Exists",
                                       "effect": "NoSchedule"}]},
    }},
}
AP_RESOURCES = ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
                "validatingadmissionpolicies", "validatingadmissionpolicybindings")
WARNING = ("Warning: Validation failed for ValidatingAdmissionPolicy 'swapwise-sandbox-warn' "
           "with binding 'swapwise-sandbox-warn': swapwise: app memory request 2Gi -> 683Mi "
           "(limit 2Gi)")



def helm(cp: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The helm SWAPWISE_HELM selects (3 or 4), as every e2e install uses."""
    proc = subprocess.run([str(cp.helm), "--kubeconfig", str(cp.kubeconfig), *args],
                          capture_output=True, text=True, timeout=180, check=False)
    assert not check or proc.returncode == 0, f"helm {args}: {proc.stderr}{proc.stdout}"
    return proc


def render_values(tmp_path: Path, *args: str) -> Path:
    """`swapwise render admission-policy --format helm-values` of POLICY, into a file."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    out = subprocess.run([SWAPWISE, "render", "admission-policy", "--policy", str(policy),
                          "--format", "helm-values", *args],
                         capture_output=True, text=True, timeout=60, check=True)
    values = tmp_path / "rendered-values.yaml"
    values.write_text(out.stdout)
    return values


def pod(name: str) -> dict[str, Any]:
    """Guaranteed memory, and a required node-affinity term of its own (placement must be
    added to it, not beside it)."""
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.kubernetes.io/zone", "operator": "In",
                     "values": ["a"]}]}]}}},
            "containers": [{"name": "app", "image": "registry.example/app:1",
                            "resources": {"requests": {"memory": "2Gi", "cpu": "1"},
                                          "limits": {"memory": "2Gi", "cpu": "1"}}}],
        },
    }


def comparable(stored: dict[str, Any]) -> dict[str, Any]:
    """metadata.annotations and spec, without what every create makes up."""
    spec = json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access-*",
                             json.dumps(stored["spec"])))
    return {"annotations": stored["metadata"].get("annotations") or {}, "spec": spec}


def create(cp: ControlPlane, namespace: str, body: dict[str, Any], *args: str) -> Any:
    out = cp.kubectl("create", "-n", namespace, "-o", "json", "-f", "-", *args,
                     input=json.dumps(body))
    return json.loads(out.stdout), out.stderr


def installed_names(cp: ControlPlane) -> list[str]:
    items = cp.get_json(",".join(AP_RESOURCES))["items"]
    return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in items)


def test_helm_install_in_admission_policy_mode_reshapes_pods_without_a_server(
    policy_cluster: ControlPlane, tmp_path: Path
) -> None:
    values = render_values(tmp_path, "--api-version", API_VERSION)
    helm(policy_cluster, "install", RELEASE, str(CHART), "--namespace", NAMESPACE,
         "--create-namespace", "-f", str(values))

    # Only the policies: no webhook configuration, no server Deployment, no Service; and the
    # node agent's own (it runs in both modes: placement needs its labels), which confines it
    # to its node.
    assert installed_names(policy_cluster) == [
        "MutatingAdmissionPolicy/swapwise-sandbox",
        "MutatingAdmissionPolicyBinding/swapwise-sandbox",
        "ValidatingAdmissionPolicy/swapwise-node-agent",
        "ValidatingAdmissionPolicy/swapwise-sandbox-warn",
        "ValidatingAdmissionPolicyBinding/swapwise-node-agent",
        "ValidatingAdmissionPolicyBinding/swapwise-sandbox-warn",
    ]
    assert policy_cluster.get_json("mutatingwebhookconfigurations")["items"] == []
    assert policy_cluster.get_json("deployments,services,secrets,configmaps", "-n", NAMESPACE,
                                   "-l", "app.kubernetes.io/instance=swapwise")["items"] == []
    labels = policy_cluster.get_json("mutatingadmissionpolicy", "swapwise-sandbox")["metadata"][
        "labels"]
    assert labels["app.kubernetes.io/managed-by"] == "Helm"
    assert labels["app.kubernetes.io/component"] == "admission-policy"
    # The same spec the renderer wrote (CEL and all), through values, templates and the API.
    rendered = yaml.safe_load(values.read_text())["admissionPolicy"]["objects"]
    for obj in rendered:
        live = policy_cluster.get_json(obj["kind"].lower(), obj["metadata"]["name"])["spec"]
        for field, value in obj["spec"].items():  # the API server defaults inside the rest
            if field not in ("matchConstraints", "matchResources"):
                assert live[field] == value, (obj["metadata"]["name"], field)

    policy_cluster.create_namespace("plain")
    policy_cluster.create_namespace("sandboxes", {PROFILE_LABEL: "sandbox"})

    # The API server loads new policies asynchronously: dry runs until one is reshaped.
    def reshaped() -> Any:
        body, stderr = create(policy_cluster, "sandboxes", pod("probe"), "--dry-run=server")
        return stderr if "swapwise.io/profile" in (body["metadata"].get("annotations") or {}) \
            else None
    policy_cluster.wait_for(reshaped, 60, what="the chart's admission policies to apply")

    # kubectl create --dry-run=server explains the change: the Warn policy's message.
    _, stderr = create(policy_cluster, "sandboxes", pod("dry"), "--dry-run=server")
    assert WARNING in stderr, stderr
    assert ("swapwise: needs nodes whose swap is >= 1999\u2030 of their RAM (node label "
            "swapwise.io/swap-permille, from the node agent)") in stderr  # and the pod's need
    assert stderr.count("swapwise:") == 2, stderr

    # Stored: what the engine gives for the pod as the API server had it before mutation
    # (the same pod, stored in a namespace that did not opt in).
    before, _ = create(policy_cluster, "plain", pod("app"))
    stored, _ = create(policy_cluster, "sandboxes", pod("app"))
    want = jsonpatch.apply_patch(before, mutate_pod(before, build_policy(POLICY).profiles[
        "sandbox"]).patch)
    assert comparable(stored) == comparable(want)
    # ...which is, spelled out:
    app = stored["spec"]["containers"][0]
    assert app["resources"] == {"requests": {"memory": "683Mi", "cpu": "1"},
                                "limits": {"memory": "2Gi", "cpu": "1"}}
    assert {"resourceName": "memory", "restartPolicy": "RestartContainer"} in app[
        "resizePolicy"]
    annotations = stored["metadata"]["annotations"]
    assert annotations["swapwise.io/profile"] == "sandbox"
    assert json.loads(annotations["swapwise.io/original"]) == {
        "app": {"request": "2Gi", "limit": "2Gi"}}
    terms = stored["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]},
        {"key": "swapwise.io/swap-node", "operator": "In", "values": ["true"]},
        # no pressure mark (the node agent's)
        {"key": "swapwise.io/memory-pressure", "operator": "DoesNotExist"},
        {"key": "swapwise.io/cpu-pressure", "operator": "DoesNotExist"},
        # swap backing: 1000 x (2048 - 683) / 683 = 1998.5 -> 1999 per mille
        {"key": "swapwise.io/swap-permille", "operator": "Gt", "values": ["1998"]}]}]
    assert {"key": "swap", "operator": "Exists", "effect": "NoSchedule"} in stored["spec"][
        "tolerations"]
    assert stored["status"]["qosClass"] == "Burstable"

    # helm uninstall takes the policies away, and the mutation with them.
    helm(policy_cluster, "uninstall", RELEASE, "--namespace", NAMESPACE)
    assert installed_names(policy_cluster) == []

    def unchanged() -> Any:
        body, stderr = create(policy_cluster, "sandboxes", pod("after"), "--dry-run=server")
        return body if not body["metadata"].get("annotations") and not stderr else None
    after = policy_cluster.wait_for(unchanged, 60, what="pods unchanged after helm uninstall")
    assert after["spec"]["containers"][0]["resources"]["requests"]["memory"] == "2Gi"


def test_helm_install_refuses_an_api_the_cluster_does_not_serve(
    policy_cluster: ControlPlane, tmp_path: Path
) -> None:
    """The other API rendered: v1beta1 (for 1.34/1.35) on a 1.37 that does not serve it (beta
    APIs are off by default), or v1 on a 1.34 that does not have it yet: a clear error from
    the chart, and nothing installed."""
    other = "v1" if API_VERSION == "v1beta1" else "v1beta1"
    values = render_values(tmp_path, "--api-version", other)
    proc = helm(policy_cluster, "install", "beta", str(CHART), "--namespace", NAMESPACE,
                "--create-namespace", "-f", str(values), check=False)
    assert proc.returncode != 0
    assert (f"this cluster does not serve admissionregistration.k8s.io/{other} "
            "MutatingAdmissionPolicy (swapwise-sandbox)") in proc.stderr, proc.stderr
    assert "--api-version v1beta1" in proc.stderr
    assert installed_names(policy_cluster) == []
    assert helm(policy_cluster, "status", "beta", "--namespace", NAMESPACE,
                check=False).returncode != 0
