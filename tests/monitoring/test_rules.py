"""The chart's alerting rules and dashboard queries, checked by the real promtool.

`promtool check rules` on the rule file, `promtool test rules` with a unit test per alert
(alerts_test.yaml), and every dashboard query parsed by Prometheus' own parser (as recording
rules in a generated rule file: promtool has no offline query parser of its own).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.monitoring.prom import DASHBOARD, RULES, ensure, panels, queries
from webhook.agent.agent_metrics import AgentMetrics

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def promtool() -> Path:
    return ensure("promtool")


def run(promtool: Path, *args: str, cwd: Path = HERE) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, check=False)


def alert_names() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["alert"] for group in groups for rule in group["rules"]]


def test_rules_check(promtool: Path) -> None:
    proc = run(promtool, "check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alert_names())} rules found" in proc.stdout


def test_every_alert_has_a_unit_test_that_passes(promtool: Path) -> None:
    tested = set(re.findall(r"alertname: (\w+)", (HERE / "alerts_test.yaml").read_text()))
    assert tested == set(alert_names())
    proc = run(promtool, "test", "rules", "alerts_test.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_a_wrong_expectation_fails(promtool: Path, tmp_path: Path) -> None:
    """The unit tests can fail: the same file with one annotation changed does."""
    text = (HERE / "alerts_test.yaml").read_text().replace(
        "../../charts/swapwise/files/prometheus-rules.yaml", str(RULES))
    assert "uses 95% of its swap limit" in text
    (tmp_path / "t.yaml").write_text(text.replace("uses 95% of", "uses 94% of"))
    proc = run(promtool, "test", "rules", "t.yaml", cwd=tmp_path)
    assert proc.returncode == 1
    assert "FAILED" in proc.stdout + proc.stderr


def test_every_dashboard_query_parses(promtool: Path, tmp_path: Path) -> None:
    found = queries()
    assert len(found) >= 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(found)
    ]}]}
    (tmp_path / "dashboard-rules.yaml").write_text(yaml.safe_dump(rules))
    proc = run(promtool, "check", "rules", "dashboard-rules.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(found)} rules found" in proc.stdout
    # and the parser does reject a broken query
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [
        {"record": "bad", "expr": "sum by (le (rate(x[5m]))"}]}]}))
    assert run(promtool, "check", "rules", "bad.yaml", cwd=tmp_path).returncode == 1


def test_dashboard_shape() -> None:
    """What Grafana needs to import it: unique ids, a datasource variable every query uses,
    panels on the 24-column grid."""
    import json

    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "swapwise"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
    text = DASHBOARD.read_text()
    # every metric swapwise exports is on the dashboard, and the kubelet's swap metrics
    for metric in ("swapwise_admission_requests_total", "swapwise_admission_duration_seconds",
                   "swapwise_containers_changed_total", "swapwise_policy_reloads_total",
                   "swapwise_certificate_reloads_total",
                   "swapwise_certificate_expiry_timestamp_seconds", "swapwise_policy_profiles",
                   "node_swap_usage_bytes", "container_swap_usage_bytes",
                   "container_swap_limit_bytes", "pod_swap_usage_bytes"):
        assert metric in text, metric


def agent_metrics() -> list[str]:
    """Every metric the node agent exports, as Prometheus names it (counters with _total)."""
    return [family.name + ("_total" if family.type == "counter" else "")
            for family in AgentMetrics().registry.collect()]


def test_every_node_agent_metric_is_on_the_dashboard() -> None:
    names = agent_metrics()
    assert len(names) == 13 and "swapwise_node_agent_patches_total" in names, names
    query_text = "\n".join(expr for _, expr in queries())
    missing = [name for name in names if not re.search(rf"\b{name}\b", query_text)]
    assert not missing, missing


def test_no_query_or_alert_reads_the_labeller_or_nfd() -> None:
    """label-nodes and its metrics are gone; NFD's key is no longer swapwise's."""
    for text in (DASHBOARD.read_text(), RULES.read_text()):
        assert "swapwise_labeller_" not in text
        assert "feature_node_kubernetes_io" not in text and "feature.node" not in text


def test_node_agent_series_exist_before_their_first_event() -> None:
    """increase() and rate() see no increase into a series' first sample: the agent's labelled
    counters start at 0, so the first mark and the first failed patch count (the dashboard's
    transitions, SwapwiseNodeAgentPatchErrors). Its verdict starts unknown, not "no swap"."""
    from prometheus_client import generate_latest

    text = generate_latest(AgentMetrics().registry).decode()
    for resource in ("memory", "cpu"):
        for to in ("marked", "cleared"):
            assert (f'swapwise_node_agent_pressure_transitions_total{{resource="{resource}",'
                    f'to="{to}"}} 0.0') in text
    for result in ("ok", "conflict", "error"):
        assert f'swapwise_node_agent_patches_total{{result="{result}"}} 0.0' in text
    assert "swapwise_node_agent_swap_node -1.0" in text
    assert "swapwise_node_agent_swap_permille -1.0" in text
