"""Dashboard, alerting rules, the node agents' PodMonitor and audit RBAC: off by default, the
first two rendered from the chart's files.

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


AGENT_SELECTOR = {"app.kubernetes.io/name": "swapwise", "app.kubernetes.io/instance": "sw",
                  "app.kubernetes.io/component": "node-agent"}
SCRAPE = {"metrics": {"serviceMonitor": {"enabled": True}}}


def test_off_by_default(chart: Chart) -> None:
    objs = chart.render()
    assert "PrometheusRule" not in kinds(objs)
    assert "PodMonitor" not in kinds(objs)
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


def test_pod_monitor_scrapes_every_node_agent_with_its_node(chart: Chart) -> None:
    """The agents' pods, by the DaemonSet's selector labels, on their port `metrics` over plain
    HTTP, with the webhook's ServiceMonitor settings; `node` from the pod's node, which the
    dashboard and the alerts group by."""
    objs = chart.render({"metrics": {"serviceMonitor": {
        "enabled": True, "interval": "15s", "labels": {"release": "kps"}}}})
    pm = one(objs, "PodMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["name"] == "sw-swapwise-node-agent"
    assert pm["metadata"]["namespace"] == "swapwise-system"
    assert pm["metadata"]["labels"]["release"] == "kps"  # what podMonitorSelector matches
    assert pm["metadata"]["labels"]["app.kubernetes.io/component"] == "node-agent"
    assert pm["spec"]["selector"] == {"matchLabels": AGENT_SELECTOR}
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["swapwise-system"]}
    assert pm["spec"]["podMetricsEndpoints"] == [{
        "port": "metrics", "scheme": "http", "path": "/metrics", "interval": "15s",
        "scrapeTimeout": "10s",
        "relabelings": [{"sourceLabels": ["__meta_kubernetes_pod_node_name"],
                         "targetLabel": "node"}],
    }]
    # the webhook's ServiceMonitor selects Services of component webhook, not the agents
    assert one(objs, "ServiceMonitor")["spec"]["selector"]["matchLabels"][
        "app.kubernetes.io/component"] == "webhook"


def test_pod_monitor_selects_the_node_agent_daemonset(chart: Chart) -> None:
    """Its selector matches the DaemonSet's pods, which name a container port `metrics`."""
    objs = chart.render(SCRAPE)
    daemonsets = [d for d in all_of(objs, "DaemonSet") if d["spec"]["template"]["metadata"][
        "labels"].get("app.kubernetes.io/component") == "node-agent"]
    if not daemonsets:
        pytest.skip("the chart renders no node-agent DaemonSet yet (templates/node-agent.yaml)")
    [ds] = daemonsets
    pm = one(objs, "PodMonitor")
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert AGENT_SELECTOR.items() <= labels.items(), labels
    assert ds["metadata"]["namespace"] == "swapwise-system"
    ports = [port for c in ds["spec"]["template"]["spec"]["containers"]
             for port in c.get("ports", [])]
    assert [p["name"] for p in ports if p["name"] == "metrics"] == ["metrics"], ports
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_without_node_agents_no_pod_monitor_and_no_rule_on_their_metrics(chart: Chart) -> None:
    """nodeAgent.enabled false: nothing to scrape, and no rule on the agents' metrics
    (SwapwiseSwapNodeWithoutAgent would fire for every swap node). The schema's nodeAgent part
    comes with templates/node-agent.yaml, so it is not validated here."""
    values = {"nodeAgent": {"enabled": False},
              "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}}
    off = chart.render(values, extra=["--skip-schema-validation"])
    assert "PodMonitor" not in kinds(off)
    assert "ServiceMonitor" in kinds(off)
    rules = [r for g in one(off, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    kept = [r for g in RULES["groups"] for r in g["rules"]
            if "swapwise_node_agent_" not in r["expr"]]
    assert rules == kept
    assert "SwapwiseReshapedPodOnNodeWithoutSwap" in [r["alert"] for r in rules]
    assert len(kept) == len([r for g in RULES["groups"] for r in g["rules"]]) - 7
    on = chart.render({**values, "nodeAgent": {"enabled": True}},
                      extra=["--skip-schema-validation"])
    assert one(on, "PrometheusRule")["spec"]["groups"] == RULES["groups"]
    assert "PodMonitor" in kinds(on)


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
