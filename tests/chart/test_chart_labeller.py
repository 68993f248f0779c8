"""The optional node labeller: off by default; minimal RBAC and a hardened pod when on.

The kubelet swapBehavior source decides one permission: only `kubelet` may read
nodes/proxy, which reaches every kubelet's whole API.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
from chartlib import Chart, Obj, all_of, kinds, one

NODE_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
PROXY_RULE = {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}


def _flag(args: list[str], flag: str) -> str:
    """The value after ``flag``, which must appear exactly once."""
    assert args.count(flag) == 1, args
    return args[args.index(flag) + 1]


def _labeller(objs: list[Obj]) -> tuple[Obj, list[str]]:
    """The labeller's ClusterRole and its container's args."""
    deployment = next(o for o in all_of(objs, "Deployment") if o["metadata"]["name"].endswith(
        "-labeller"))
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return one(objs, "ClusterRole"), list(c["args"])


def test_off_by_default(chart: Chart) -> None:
    objs = chart.render()
    assert "ClusterRole" not in kinds(objs)
    assert all("labeller" not in o["metadata"]["name"] for o in objs)


def test_enabled_objects_rbac_and_pod(chart: Chart) -> None:
    objs = chart.render({"labeller": {"enabled": True, "label": "example.com/swap=yes"}})
    labeller = [o for o in objs if o["metadata"]["name"].endswith("-labeller")]
    assert sorted(kinds(labeller)) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"]
    )
    [cluster_role] = all_of(objs, "ClusterRole")
    assert cluster_role["rules"] == [NODE_RULE]
    role = one(objs, "Role")
    assert {r["resources"][0] for r in role["rules"]} == {"leases"}
    assert all(r["apiGroups"] == ["coordination.k8s.io"] for r in role["rules"])
    deployment = next(o for o in all_of(objs, "Deployment") if o in labeller)
    pod = deployment["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["args"][0] == "label-nodes" or "label-nodes" in c.get("command", []) + c["args"]
    assert "example.com/swap=yes" in " ".join(c["args"])
    assert _flag(c["args"], "--swap-behavior-source") == "declared"  # the safe default
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for obj in labeller:
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


@pytest.mark.parametrize("source", ["declared", "kubelet"])
def test_swap_behavior_source_sets_the_flag_and_only_kubelet_gets_nodes_proxy(
    chart: Chart, source: str
) -> None:
    objs = chart.render({"labeller": {"enabled": True, "swapBehaviorSource": source}})
    cluster_role, args = _labeller(objs)
    assert _flag(args, "--swap-behavior-source") == source
    # Patch stays in both: the label and the swapwise.io/swap-node annotation.
    expected = [NODE_RULE, PROXY_RULE] if source == "kubelet" else [NODE_RULE]
    assert cluster_role["rules"] == expected
    kubernetes_validate.validate(cluster_role, "1.34.0", strict=True)


@pytest.mark.parametrize(
    "values",
    [{"labeller": {"enabled": True, "label": "no-value-sign"}},
     {"labeller": {"enabled": True, "metricsPort": 0}},
     {"labeller": {"enabled": True, "unknown": 1}},
     {"labeller": {"enabled": True, "swapBehaviorSource": "Kubelet"}},
     {"labeller": {"enabled": True, "swapBehaviorSource": ""}}],
)
def test_bad_labeller_values_are_refused(chart: Chart, values: dict[str, object]) -> None:
    assert chart.error(values)
