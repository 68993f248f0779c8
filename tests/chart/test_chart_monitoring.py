"""Dashboard, alerting rules and audit RBAC: off by default, rendered from the chart's files.

The rule file and the dashboard are tested themselves with the real promtool (and a real
Prometheus) in tests/monitoring/; here that the chart ships them unchanged.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from chartlib import CHART, REPO, Chart, all_of, kinds, one

RULES = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
DASHBOARD = json.loads((CHART / "files" / "dashboard.json").read_text())


def test_off_by_default(chart: Chart) -> None:
    objs = chart.render()
    assert "PrometheusRule" not in kinds(objs)
    assert not [o for o in all_of(objs, "ConfigMap") if o["metadata"]["name"].endswith(
        "-dashboard")]
    assert not [o for o in objs if o["metadata"]["name"].endswith("-audit")]


def test_prometheus_rule_is_the_rule_file(chart: Chart) -> None:
    objs = chart.render({"metrics": {"prometheusRule": {"enabled": True,
                                                        "labels": {"release": "kps"}}}})
    rule = one(objs, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["metadata"]["namespace"] == "swapwise-system"
    assert rule["spec"]["groups"] == RULES["groups"]
    # Helm did not evaluate the alert templates ({{ $labels.x }} reaches Prometheus).
    assert "{{ $labels.instance }}" in json.dumps(rule)


def test_dashboard_configmap_for_the_grafana_sidecar(chart: Chart) -> None:
    objs = chart.render({"metrics": {"grafanaDashboard": {
        "enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "swap"}}}})
    [cm] = [o for o in all_of(objs, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "swap"}
    assert json.loads(cm["data"]["swapwise.json"]) == DASHBOARD


@pytest.mark.parametrize("values", [
    {"metrics": {"prometheusRule": {"enabled": True, "severity": "x"}}},
    {"metrics": {"grafanaDashboard": {"enabled": "yes"}}},
    {"audit": {"rbac": {"create": True, "extra": 1}}},
])
def test_bad_values_are_refused(chart: Chart, values: dict[str, object]) -> None:
    chart.error(values)


def test_audit_rbac_is_the_documented_clusterrole(chart: Chart) -> None:
    objs = chart.render({"audit": {"rbac": {"create": True}}})
    role = one(objs, "ClusterRole", "sw-swapwise-audit")
    text = (REPO / "docs" / "audit.md").read_text()
    [documented] = [d for d in (yaml.safe_load(b) for b in re.findall(
        r"```yaml\n(.*?)```", text, re.S)) if isinstance(d, dict) and d.get("kind") ==
        "ClusterRole"]
    assert role["rules"] == documented["rules"]
    binding = one(objs, "ClusterRoleBinding", "sw-swapwise-audit")
    account = one(objs, "ServiceAccount", role["metadata"]["name"])
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": account["metadata"]["name"],
                                    "namespace": "swapwise-system"}]
