"""HPAs on memory utilisation: the factor, the fixes, and the warnings of preview and plan."""

from __future__ import annotations

import json
from fractions import Fraction
from typing import Any

import pytest
import yaml

from testkit.engine_tables import backing_warning
from tests.cli.test_cli import swapwise
from webhook.analysis.hpa import memory_utilisation_metrics, utilisation_warnings

GI, MI = 1024**3, 1024**2


def hpa(metrics: list[dict[str, Any]], kind: str = "Deployment", name: str = "web",
        api: str = "autoscaling/v2") -> dict[str, Any]:
    return {"apiVersion": api, "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web-hpa"},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
                     "minReplicas": 1, "maxReplicas": 10, "metrics": metrics}}


def memory(target: dict[str, Any], container: str | None = None) -> dict[str, Any]:
    if container is None:
        return {"type": "Resource", "resource": {"name": "memory", "target": target}}
    return {"type": "ContainerResource",
            "containerResource": {"name": "memory", "container": container, "target": target}}


UTIL75 = {"type": "Utilization", "averageUtilization": 75}


def deployment(*containers: dict[str, Any], name: str = "web") -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": list(containers)}}}}


def container(name: str, limit: str, request: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"limits": {"memory": limit, "cpu": "1"}}
    if request is not None:
        resources["requests"] = {"memory": request, "cpu": "1"}
    return {"name": name, "image": "nginx", "resources": resources}


def pod_of(*containers: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": list(containers)}}


def test_only_memory_utilisation_metrics_count() -> None:
    metrics = [
        {"type": "Resource", "resource": {"name": "cpu", "target": UTIL75}},
        memory({"type": "AverageValue", "averageValue": "1Gi"}),
        memory(UTIL75),
        memory({"type": "Utilization", "averageUtilization": 50}, container="app"),
        {"type": "Pods", "pods": {"metric": {"name": "x"}, "target": {"type": "AverageValue"}}},
    ]
    found = memory_utilisation_metrics(hpa(metrics))
    assert [(m.container, m.target) for m in found] == [(None, 75), ("app", 50)]


def test_factor_is_old_request_over_new_summed_over_the_pods_containers() -> None:
    before = pod_of(container("app", "2Gi"), container("side", "1Gi", "512Mi"))
    after = pod_of(container("app", "2Gi", "683Mi"), container("side", "1Gi", "512Mi"))
    [warning] = utilisation_warnings(hpa([memory(UTIL75)]), before, after)
    assert (warning.request_before, warning.request_after) == (2560 * MI, 1195 * MI)
    assert warning.factor == Fraction(2560, 1195)
    assert warning.scaled_target == 161  # 75 * 2560/1195 = 160.7
    assert warning.average_value == 1920 * MI  # 75 % of 2560Mi: the same scaling point
    [one] = utilisation_warnings(hpa([memory(UTIL75, "app")]), before, after)
    assert one.factor == Fraction(2048, 683) and one.container == "app"
    # The untouched container alone: no rise, no warning.
    assert utilisation_warnings(hpa([memory(UTIL75, "side")]), before, after) == []


def test_no_warning_when_a_container_has_no_request() -> None:
    """The HPA cannot compute utilisation then at all; swapwise has nothing to add."""
    before = pod_of({"name": "app", "image": "x"})
    assert utilisation_warnings(hpa([memory(UTIL75)]), before, before) == []


BACKING = backing_warning(1999)  # 2Gi -> 683Mi
MANIFEST = [
    deployment(container("app", "2Gi")),
    hpa([memory(UTIL75)]),
    deployment(container("app", "2Gi"), name="other"),
    hpa([memory({"type": "AverageValue", "averageValue": "1Gi"})], name="other"),
]


def test_preview_warns_with_the_factor_and_the_fixes() -> None:
    out = swapwise("preview", "-f", "-", stdin=yaml.safe_dump_all(MANIFEST))
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "Warning: Deployment/web: swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)",
        f"Warning: Deployment/web: {BACKING}",
        "Warning: Deployment/web: HorizontalPodAutoscaler/web-hpa scales Deployment/web on "
        "memory utilisation 75% of the pod; swapwise lowers its memory request 2Gi -> 683Mi, "
        "so utilisation rises x3.00 for the same usage and the HPA scales out: switch the "
        "metric to target.type AverageValue, averageValue 1536Mi (the same point), or set "
        "averageUtilization 225",
        "Warning: Deployment/other: swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)",
        f"Warning: Deployment/other: {BACKING}",
    ]
    # The HPAs pass through untouched.
    assert list(yaml.safe_load_all(out.stdout))[1] == MANIFEST[1]


@pytest.mark.parametrize("namespaces", [("a", "a"), ("a", None), ("a", "b")])
def test_preview_matches_hpas_by_namespace(namespaces: tuple[str, str | None]) -> None:
    workload, scaler = deployment(container("app", "2Gi")), hpa([memory(UTIL75)])
    workload["metadata"]["namespace"] = namespaces[0]
    if namespaces[1] is not None:
        scaler["metadata"]["namespace"] = namespaces[1]
    out = swapwise("preview", "-f", "-", stdin=yaml.safe_dump_all([workload, scaler]))
    warned = "HorizontalPodAutoscaler/web-hpa" in out.stderr
    assert warned == (namespaces != ("a", "b"))


def test_plan_reports_hpas_in_json_and_on_stderr() -> None:
    out = swapwise("plan", "-f", "-", "--node-memory", "16Gi", "--node-swap", "32Gi",
                   "--node-cpu", "8", "-o", "json", stdin=yaml.safe_dump_all(MANIFEST))
    assert out.returncode == 0, out.stderr
    workloads = {w["name"]: w for w in json.loads(out.stdout)["workloads"]}
    assert workloads["other"]["hpa"] == []
    assert workloads["web"]["hpa"] == [{
        "hpa": "web-hpa", "namespace": None,
        "target": {"kind": "Deployment", "name": "web"}, "container": None,
        "averageUtilization": 75, "requestBefore": 2 * GI, "requestAfter": 683 * MI,
        "factor": pytest.approx(2048 / 683), "suggestedAverageUtilization": 225,
        "suggestedAverageValue": 1536 * MI,
    }]
    assert "HorizontalPodAutoscaler/web-hpa scales Deployment/web" in out.stderr
