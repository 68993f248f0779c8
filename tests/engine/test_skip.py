"""docs/rules.md: the skip rules: pods left exactly as they came (engine/mutate.py)."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.engine_check import apply
from testkit.engine_tables import DEFAULT, memory, profile
from testkit.pods import guaranteed, pod
from webhook.engine import mutate_pod


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        (pod(guaranteed(), labels={"swapwise.io/skip": "true"}), "opted out"),
        (pod(guaranteed(), annotations={"swapwise.io/skip": "true"}), "opted out"),
        (pod(guaranteed(), priorityClassName="system-node-critical"), "critical pod"),
        (pod(guaranteed(), priorityClassName="system-cluster-critical"), "critical pod"),
        (pod(guaranteed(), priority=2_000_000_000), "critical pod"),
        (pod(guaranteed(), priority=2_000_001_000), "critical pod"),
        (pod(guaranteed(), annotations={"kubernetes.io/config.mirror": "abc"}), "critical pod"),
        (pod(guaranteed(), os={"name": "windows"}), "windows pod"),
    ],
)
def test_untouched_pods(p: dict[str, Any], reason: str) -> None:
    mutation = mutate_pod(p, DEFAULT)
    assert mutation.patch == [] and mutation.skipped == reason


def test_high_but_not_critical_priority_is_mutated() -> None:
    result, _ = apply(pod(guaranteed(), priority=1_999_999_999), DEFAULT)
    assert memory(result)["request"] == "683Mi"


def test_skip_false_is_not_an_opt_out() -> None:
    result, _ = apply(pod(guaranteed(), labels={"swapwise.io/skip": "false"}), DEFAULT)
    assert memory(result)["request"] == "683Mi"


def test_linux_os_is_mutated() -> None:
    result, _ = apply(pod(guaranteed(), os={"name": "linux"}), DEFAULT)
    assert memory(result)["request"] == "683Mi"


def test_pod_selector() -> None:
    prof = profile(podSelector={
        "matchLabels": {"app.kubernetes.io/component": "sandbox"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]},
                             {"key": "legacy", "operator": "DoesNotExist"}],
    })
    sandbox = {"app.kubernetes.io/component": "sandbox"}
    assert mutate_pod(pod(guaranteed()), prof).skipped == "podSelector does not match"
    assert mutate_pod(pod(guaranteed(), labels=sandbox | {"tier": "db"}), prof).patch == []
    assert mutate_pod(pod(guaranteed(), labels=sandbox | {"legacy": ""}), prof).patch == []
    result, _ = apply(pod(guaranteed(), labels=sandbox | {"tier": "web"}), prof)
    assert memory(result)["request"] == "683Mi"


def test_pod_selector_in_and_exists() -> None:
    prof = profile(podSelector={"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["a", "b"]},
        {"key": "team", "operator": "Exists"}]})
    assert mutate_pod(pod(guaranteed(), labels={"app": "b", "team": "x"}), prof).patch
    assert not mutate_pod(pod(guaranteed(), labels={"app": "c", "team": "x"}), prof).patch
    assert not mutate_pod(pod(guaranteed(), labels={"app": "a"}), prof).patch


def test_guaranteed_pods_skip() -> None:
    prof = profile(guaranteedPods="skip")
    assert mutate_pod(pod(guaranteed()), prof).skipped == "guaranteed pod (guaranteedPods: skip)"
    # Burstable (cpu request < limit) with a memory request == limit: converted.
    c = {"name": "app", "resources": {"requests": {"memory": "1Gi", "cpu": "100m"},
                                      "limits": {"memory": "1Gi", "cpu": "1"}}}
    result, _ = apply(pod(c), prof)
    assert memory(result)["request"] == "342Mi"
