"""docs/rules.md: resizePolicy, and which init containers and sidecars get it (engine/resize.py)."""

from __future__ import annotations

import pytest

from testkit.engine_check import apply
from testkit.engine_tables import DEFAULT, memory, profile
from testkit.pods import guaranteed, pod


def test_init_containers_changed_but_plain_ones_get_no_resize_policy() -> None:
    sidecar = guaranteed("1Gi", name="proxy") | {"restartPolicy": "Always"}
    p = pod(guaranteed("2Gi"), init=[guaranteed("1Gi", name="setup"), sidecar])
    result, _ = apply(p, DEFAULT)
    setup, proxy = result["spec"]["initContainers"]
    assert memory(result, 0, "initContainers")["request"] == "342Mi"
    assert memory(result, 1, "initContainers")["request"] == "342Mi"
    assert "resizePolicy" not in setup
    restart = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    assert proxy["resizePolicy"] == restart
    assert result["spec"]["containers"][0]["resizePolicy"] == proxy["resizePolicy"]


@pytest.mark.parametrize("restart", ["Never"])
def test_restart_policy_never_gets_no_resize_policy(restart: str) -> None:
    sidecar = guaranteed("1Gi", name="proxy") | {"restartPolicy": "Always"}
    result, _ = apply(pod(guaranteed(), init=[sidecar], restartPolicy=restart), DEFAULT)
    assert "resizePolicy" not in result["spec"]["containers"][0]
    assert "resizePolicy" not in result["spec"]["initContainers"][0]
    assert memory(result)["request"] == "683Mi"


def test_restart_policy_on_failure_gets_resize_policy() -> None:
    result, _ = apply(pod(guaranteed(), restartPolicy="OnFailure"), DEFAULT)
    assert result["spec"]["containers"][0]["resizePolicy"][0]["restartPolicy"] == "RestartContainer"


def test_existing_memory_resize_policy_is_replaced_with_a_warning() -> None:
    c = guaranteed() | {"resizePolicy": [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"},
    ]}
    result, mutation = apply(pod(c), DEFAULT)
    assert result["spec"]["containers"][0]["resizePolicy"] == [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "RestartContainer"},
    ]
    assert any("resizePolicy NotRequired -> RestartContainer" in w for w in mutation.warnings)


def test_cpu_only_resize_policy_gets_memory_appended() -> None:
    c = guaranteed() | {"resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]}
    result, _ = apply(pod(c), DEFAULT)
    assert result["spec"]["containers"][0]["resizePolicy"][1] == {
        "resourceName": "memory", "restartPolicy": "RestartContainer"}


def test_resize_policy_keep() -> None:
    result, _ = apply(pod(guaranteed()), profile(resizePolicy="keep"))
    assert "resizePolicy" not in result["spec"]["containers"][0]
