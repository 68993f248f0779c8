"""The optional node labeller: off by default; minimal RBAC and a hardened pod when on."""

from __future__ import annotations

import kubernetes_validate
import pytest
from chartlib import Chart, all_of, kinds, one


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
    assert cluster_role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    role = one(objs, "Role")
    assert {r["resources"][0] for r in role["rules"]} == {"leases"}
    assert all(r["apiGroups"] == ["coordination.k8s.io"] for r in role["rules"])
    deployment = next(o for o in all_of(objs, "Deployment") if o in labeller)
    pod = deployment["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["args"][0] == "label-nodes" or "label-nodes" in c.get("command", []) + c["args"]
    assert "example.com/swap=yes" in " ".join(c["args"])
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for obj in labeller:
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


@pytest.mark.parametrize(
    "values",
    [{"labeller": {"enabled": True, "label": "no-value-sign"}},
     {"labeller": {"enabled": True, "metricsPort": 0}},
     {"labeller": {"enabled": True, "unknown": 1}}],
)
def test_bad_labeller_values_are_refused(chart: Chart, values: dict[str, object]) -> None:
    assert chart.error(values)
