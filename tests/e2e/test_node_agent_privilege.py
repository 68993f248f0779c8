"""The node agent's least privilege, enforced by a real kube-apiserver (issue 42).

The chart's ServiceAccount, RBAC and ValidatingAdmissionPolicy (+ binding) for the agent are
rendered with `helm template` and applied. Two fake Nodes, A and B; a pod of the agent's
ServiceAccount bound to A (`spec.nodeName`; no kubelet runs it). A token bound to that pod
(TokenRequest, `boundObjectRef` kind Pod) carries A's name: the API server writes the node of
a pod-bound token into its claims and reports it as `request.userInfo.extra
["authentication.kubernetes.io/node-name"]`, which the policy compares with the Node. With that
token: patching B is denied, patching a key of A outside swapwise.io/ is denied, and patching
A's swapwise.io/ keys (the agent's own patch, made by webhook/agent/decide.py and sent by its
own client) is allowed. A token bound to no pod is denied everywhere.

Each outcome is written to build/e2e/node-agent-privilege.json (and printed): results.json's
`agent.denied_other_node` and `agent.denied_foreign_key` come from there.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.chartlib import Chart, server_side_dry_run
from tests.e2e.cluster import K8S_VERSION, ControlPlane, wait_for
from webhook.agent.decide import Behavior, MarkWant, desired_change, judge
from webhook.agent.kernel import SwapDevice, SwapFacts
from webhook.agent.nodeapi import ApiConfig, ApiError, NodeApi
from webhook.engine.pressure import MARKS

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "build" / "e2e" / "node-agent-privilege.json"
RELEASE = NAMESPACE = "swapwise-priv"  # the release name holds "swapwise": fullname = release
AGENT = f"{RELEASE}-node-agent"
NODE_A, NODE_B = "agent-priv-a", "agent-priv-b"
POD = "agent-on-a"
# Already on node A: keys that are not swapwise's, which the agent must leave as they are. The
# taint also keeps every other test's pods off these nodes.
FOREIGN_TAINT = {"key": "example.com/keep", "value": "1", "effect": "NoSchedule"}
PREFIX = "swapwise node agent: refused"
GI = 1 << 30

OUTCOMES: dict[str, dict[str, Any]] = {}


@dataclass
class Setup:
    cp: ControlPlane
    bound: str  # token bound to the pod on node A
    unbound: str  # token of the same ServiceAccount, bound to nothing
    claims: dict[str, Any]  # the bound token's JWT claims
    extra: dict[str, list[str]]  # userInfo.extra of the bound token, as the API server sees it
    context: ssl.SSLContext


def _claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))


def request(setup: Setup, token: str | None, method: str, path: str,
            body: dict[str, Any] | None = None,
            content_type: str = "application/merge-patch+json") -> tuple[int, dict[str, Any]]:
    """One call to the API server as ``token`` (None: the cluster admin); (status, body)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(f"{setup.cp.server}{path}", method=method, headers=headers,
                                 data=json.dumps(body).encode() if body is not None else None)
    context = setup.context if token is not None else setup.cp.admin_context()
    try:
        with urllib.request.urlopen(req, context=context, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def node(setup: Setup, name: str) -> dict[str, Any]:
    found: dict[str, Any] = setup.cp.get_json("node", name)
    return found


def taints(setup: Setup, name: str) -> list[dict[str, Any]]:
    return list(node(setup, name)["spec"].get("taints") or [])


@pytest.fixture(scope="module")
def setup(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Setup]:
    cp = control_plane
    chart = Chart(cp.helm, tmp_path_factory.mktemp("chart"),
                  kube_version=K8S_VERSION.lstrip("v"))
    # The kubelet source: the widest RBAC the chart renders for the agent.
    objs = chart.render({"nodeAgent": {"swapBehaviorSource": "kubelet"}}, release=RELEASE,
                        namespace=NAMESPACE)
    agent = [o for o in objs
             if o["metadata"]["labels"].get("app.kubernetes.io/component") == "node-agent"]
    assert "nodes/proxy" not in json.dumps(objs)
    applied = [o for o in agent if o["kind"] != "DaemonSet"]
    assert sorted(o["kind"] for o in applied) == [
        "ClusterRole", "ClusterRoleBinding", "ServiceAccount", "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding"]
    cp.create_namespace(NAMESPACE)
    try:
        cp.apply(yaml.safe_dump_all(applied))
        # The DaemonSet is accepted as rendered (applied for real, its controller would put
        # pods on every node of this shared control plane).
        [daemonset] = [o for o in agent if o["kind"] == "DaemonSet"]
        dry = server_side_dry_run([daemonset], kubectl=cp.bin / "kubectl",
                                  kubeconfig=cp.kubeconfig)
        assert dry.returncode == 0, dry.stderr
        yield from _nodes_pod_tokens(cp)
    finally:
        for kind, name in (("validatingadmissionpolicybinding", AGENT),
                           ("validatingadmissionpolicy", AGENT),
                           ("clusterrolebinding", AGENT), ("clusterrole", AGENT),
                           ("node", NODE_A), ("node", NODE_B)):
            cp.kubectl("delete", kind, name, "--ignore-not-found", "--wait=false", check=False)
        cp.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _nodes_pod_tokens(cp: ControlPlane) -> Iterator[Setup]:
    for name in (NODE_A, NODE_B):
        cp.create_node(name, memory="8Gi", cpu="4", swap_capacity=16 * GI,
                       labels={"example.com/keep": "1"})
        cp.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({
            "metadata": {"annotations": {"example.com/keep": "1"}},
            "spec": {"taints": [FOREIGN_TAINT]}}))
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": POD, "namespace": NAMESPACE},
           "spec": {"serviceAccountName": AGENT, "nodeName": NODE_A,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "node-agent", "image": "swapwise:0.1.0"}]}}
    created = json.loads(cp.kubectl("create", "-f", "-", "-o", "json",
                                    input=json.dumps(pod)).stdout)
    bound = cp.kubectl("create", "token", AGENT, "-n", NAMESPACE, "--duration=10m",
                       "--bound-object-kind=Pod", f"--bound-object-name={POD}",
                       f"--bound-object-uid={created['metadata']['uid']}").stdout.strip()
    unbound = cp.kubectl("create", "token", AGENT, "-n", NAMESPACE,
                         "--duration=10m").stdout.strip()
    context = ssl.create_default_context(cafile=str(cp.pki / "ca.crt"))
    setup = Setup(cp, bound, unbound, _claims(bound), {}, context)
    status, review = request(setup, bound, "POST",
                             "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                             {"apiVersion": "authentication.k8s.io/v1",
                              "kind": "SelfSubjectReview"}, "application/json")
    assert status == 201, review
    setup.extra = review["status"]["userInfo"].get("extra", {})

    # The policy acts once the API server has loaded it and its binding (and RBAC lets the
    # patch through to admission): until then a dry run is allowed, or refused by RBAC.
    def enforced() -> bool:
        status, body = request(setup, bound, "PATCH", f"/api/v1/nodes/{NODE_B}?dryRun=All",
                               {"metadata": {"labels": {"swapwise.io/warm-up": "1"}}})
        return status == 403 and PREFIX in body.get("message", "")

    wait_for(enforced, 60, interval=0.5, what="the node agent's admission policy in force",
             on_timeout=cp.logs)
    yield setup


def test_the_bound_token_names_node_a(setup: Setup) -> None:
    assert setup.claims["kubernetes.io"]["node"]["name"] == NODE_A
    assert setup.claims["kubernetes.io"]["pod"]["name"] == POD
    assert setup.extra["authentication.kubernetes.io/node-name"] == [NODE_A]
    assert "node" not in _claims(setup.unbound)["kubernetes.io"]


def test_the_policy_type_checks(setup: Setup) -> None:
    """The API server compiled and type-checked every expression against the Node schema."""
    policy = node_policy(setup)
    assert policy["status"]["observedGeneration"] == policy["metadata"]["generation"]
    assert not policy["status"].get("typeChecking", {}).get("expressionWarnings"), policy["status"]
    assert not [c for c in policy["status"].get("conditions", []) if c.get("status") == "False"]


def node_policy(setup: Setup) -> dict[str, Any]:
    def checked() -> dict[str, Any] | None:
        policy: dict[str, Any] = setup.cp.get_json("validatingadmissionpolicy", AGENT)
        status = policy.get("status") or {}
        return policy if status.get("observedGeneration") == policy["metadata"][
            "generation"] else None

    return wait_for(checked, 30, what="the policy's type check")


def swapwise_taint(effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": "swapwise.io/memory-pressure", "value": "true", "effect": effect}


# (name, token: bound|unbound|admin, node, patch body or a callable of the setup giving it,
#  subresource, allowed?, what a denial's message must say)
CASES: list[tuple[str, str, str, Any, str, bool, str]] = [
    ("other_node", "bound", NODE_B, {"metadata": {"labels": {"swapwise.io/swap-node": "true"}}},
     "", False, f"the token is bound to node {NODE_A}, and may update only that node"),
    ("foreign_label", "bound", NODE_A, {"metadata": {"labels": {"example.com/x": "1"}}},
     "", False, "refused to change labels outside swapwise.io/ on node agent-priv-a: "
     "example.com/x"),
    ("foreign_label_removed", "bound", NODE_A,
     {"metadata": {"labels": {"example.com/keep": None}}}, "", False,
     "labels outside swapwise.io/ on node agent-priv-a: example.com/keep"),
    ("foreign_label_changed", "bound", NODE_A,
     {"metadata": {"labels": {"kubernetes.io/hostname": "elsewhere"}}}, "", False,
     "labels outside swapwise.io/ on node agent-priv-a: kubernetes.io/hostname"),
    ("foreign_annotation", "bound", NODE_A,
     {"metadata": {"annotations": {"example.com/x": "1"}}}, "", False,
     "refused to change annotations outside swapwise.io/ on node agent-priv-a: example.com/x"),
    ("foreign_annotation_removed", "bound", NODE_A,
     {"metadata": {"annotations": {"example.com/keep": None}}}, "", False,
     "annotations outside swapwise.io/ on node agent-priv-a: example.com/keep"),
    ("foreign_taint", "bound", NODE_A,
     lambda s: {"spec": {"taints": [*taints(s, NODE_A), {"key": "example.com/x",
                                                        "effect": "NoSchedule"}]}},
     "", False, "refused to change taints outside swapwise.io/ on node agent-priv-a: "
     "example.com/x"),
    ("foreign_taint_removed", "bound", NODE_A,
     lambda s: {"spec": {"taints": [t for t in taints(s, NODE_A)
                                    if t["key"] != FOREIGN_TAINT["key"]] or None}},
     "", False, "taints outside swapwise.io/ on node agent-priv-a: example.com/keep"),
    ("evicting_own_taint", "bound", NODE_A,
     lambda s: {"spec": {"taints": [*taints(s, NODE_A), swapwise_taint("NoExecute")]}},
     "", False, "refused a swapwise.io/ taint whose effect is not NoSchedule on node "
     "agent-priv-a: swapwise.io/memory-pressure:NoExecute"),
    ("unschedulable", "bound", NODE_A, {"spec": {"unschedulable": True}}, "", False,
     "refused to change spec.unschedulable of node agent-priv-a"),
    ("pod_cidr", "bound", NODE_A, {"spec": {"podCIDR": "10.244.9.0/24"}}, "", False,
     "refused to change spec.podCIDR, spec.podCIDRs of node agent-priv-a"),
    ("finalizers", "bound", NODE_A, {"metadata": {"finalizers": ["example.com/hold"]}}, "",
     False, "refused to change metadata.finalizers of node agent-priv-a"),
    ("status_subresource", "bound", NODE_A,
     {"metadata": {"labels": {"swapwise.io/swap-node": "true"}}}, "status", False,
     'cannot patch resource "nodes/status"'),  # RBAC: never granted
    ("unbound_token", "unbound", NODE_A,
     {"metadata": {"labels": {"swapwise.io/swap-node": "true"}}}, "", False,
     "the token is bound to no node (no authentication.kubernetes.io/node-name claim)"),
    ("unbound_token_other_node", "unbound", NODE_B,
     {"metadata": {"labels": {"swapwise.io/swap-node": "true"}}}, "", False,
     "the token is bound to no node"),
    ("own_labels_and_annotations", "bound", NODE_A,
     {"metadata": {"labels": {"swapwise.io/swap-node": "true", "swapwise.io/swap-kind": "disk",
                              "swapwise.io/swap-permille": "2000"},
                   "annotations": {"swapwise.io/swap-node": "true: e2e"}}}, "", True, ""),
    ("own_taint", "bound", NODE_A,
     lambda s: {"spec": {"taints": [*taints(s, NODE_A), swapwise_taint()]}}, "", True, ""),
    ("own_keys_removed", "bound", NODE_A,
     lambda s: {"metadata": {"labels": {"swapwise.io/swap-kind": None}},
                "spec": {"taints": [t for t in taints(s, NODE_A)
                                    if not t["key"].startswith("swapwise.io/")]}},
     "", True, ""),
    # The policy binds the agent only: anyone else is left to RBAC as before.
    ("admin_foreign_label", "admin", NODE_A, {"metadata": {"labels": {"example.com/y": "1"}}},
     "", True, ""),
]


@pytest.mark.parametrize(("name", "token", "target", "body", "subresource", "allowed", "said"),
                         CASES, ids=[c[0] for c in CASES])
def test_patch(setup: Setup, name: str, token: str, target: str, body: Any, subresource: str,
               allowed: bool, said: str) -> None:
    before = node(setup, target)
    patch = body(setup) if callable(body) else body
    bearer = {"bound": setup.bound, "unbound": setup.unbound, "admin": None}[token]
    path = f"/api/v1/nodes/{target}" + (f"/{subresource}" if subresource else "")
    status, answer = request(setup, bearer, "PATCH", path, patch)
    message = answer.get("message", "") if status != 200 else ""
    OUTCOMES[name] = {"token": token, "node": target, "patch": patch, "status": status,
                      "allowed": status == 200, "message": message}
    if allowed:
        assert status == 200, answer
        return
    assert status == 403, answer
    assert said in message, message
    if not subresource:
        assert f"ValidatingAdmissionPolicy '{AGENT}' with binding '{AGENT}' denied request: " \
            f"{PREFIX}" in message, message
    after = node(setup, target)  # nothing of a denied patch was stored
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def test_the_agents_own_patches_pass_and_foreign_ones_do_not(setup: Setup) -> None:
    """What webhook/agent decides for a swap node marked under pressure (taint form), then
    cleared, sent by its own client with the pod-bound token: allowed on A, denied on B."""
    api = NodeApi(ApiConfig(setup.cp.server, setup.context, token=setup.bound))
    swap = SwapFacts((SwapDevice("/swapfile", "disk", 16 * GI, 0),))
    behavior = Behavior("LimitedSwap", "declared")
    for marked in (True, False):
        current = api.get(NODE_A)
        wants = {mark: MarkWant(marked, f"{'marked' if marked else 'cleared'}: e2e")
                 for mark in MARKS}
        change = desired_change(current, judge(current, swap, behavior), wants, "taint")
        assert change is not None
        updated = api.patch(NODE_A, change.patch)
        keys = {t["key"] for t in updated["spec"].get("taints") or []}
        assert FOREIGN_TAINT["key"] in keys
        assert {m.key for m in MARKS} <= keys if marked else not {m.key for m in MARKS} & keys
        assert updated["metadata"]["labels"]["swapwise.io/swap-node"] == "true"
        assert updated["metadata"]["labels"]["swapwise.io/swap-permille"] == "2000"
        assert updated["metadata"]["labels"]["example.com/keep"] == "1"
    OUTCOMES["agent_patch_own_node"] = {"token": "bound", "node": NODE_A, "status": 200,
                                        "allowed": True, "message": ""}
    other = api.get(NODE_B)
    change = desired_change(other, judge(other, swap, behavior), {
        m: MarkWant(True, "marked: e2e") for m in MARKS}, "label")
    assert change is not None
    with pytest.raises(ApiError) as refused:
        api.patch(NODE_B, change.patch)
    assert refused.value.status == 403
    assert f"the token is bound to node {NODE_A}" in str(refused.value)
    OUTCOMES["agent_patch_other_node"] = {"token": "bound", "node": NODE_B, "status": 403,
                                          "allowed": False, "message": str(refused.value)}
    assert "swapwise.io/swap-node" not in node(setup, NODE_B)["metadata"]["labels"]


def test_outcomes_are_recorded(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    """Last: every case's outcome, for results.json (agent.denied_other_node and
    agent.denied_foreign_key) and for the eye."""
    record = {
        "denied_other_node": OUTCOMES.get("other_node", {}).get("allowed") is False
        and OUTCOMES.get("agent_patch_other_node", {}).get("allowed") is False,
        "denied_foreign_key": all(OUTCOMES.get(case, {}).get("allowed") is False
                                  for case in ("foreign_label", "foreign_label_removed",
                                               "foreign_annotation", "foreign_taint")),
        "allowed_own_keys": all(OUTCOMES.get(case, {}).get("allowed") is True
                                for case in ("own_labels_and_annotations", "own_taint",
                                             "agent_patch_own_node")),
        "kube_apiserver": K8S_VERSION,
        "cases": OUTCOMES,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=2) + "\n")
    with capsys.disabled():
        print(f"\nnode agent privilege on kube-apiserver {K8S_VERSION} ({RESULTS}):")
        for case, outcome in OUTCOMES.items():
            verdict = "allowed" if outcome["allowed"] else f"denied {outcome['status']}"
            print(f"  {case:28} {verdict:11} {outcome['message']}")
    assert len(OUTCOMES) == len(CASES) + 2
    assert record["denied_other_node"] and record["denied_foreign_key"]
    assert record["allowed_own_keys"]
