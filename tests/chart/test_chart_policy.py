"""The policy ConfigMap is the policy file (README "Policy reference"), rendered from the same
values as the webhooks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import RELEASE, Chart, one, webhooks

FULL_PROFILE = {
    "swapRatio": 2,
    "minRequest": "64Mi",
    "maxLimitRequestRatio": 8,
    "defaultLimit": "2Gi",
    "guaranteedPods": "convert",
    "vpaPods": "raiseLimit",
    "resizePolicy": "RestartContainer",
    "podSelector": {
        "matchLabels": {"app.kubernetes.io/component": "sandbox"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}],
    },
    "placement": {
        "mode": "required",
        "nodeSelector": {"swapwise.io/swap-node": "true"},
        "weight": 100,
        "tolerations": [{"key": "swap", "operator": "Exists", "effect": "NoSchedule"}],
        "swapBacking": "required",
    },
}

CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "spec-example": {
        "profiles": {"default": None, "sandbox": FULL_PROFILE},
        "namespaces": {"team-a": {"requestRatio": 0.25},
                       "legacy": {"placement": {"swapBacking": "off"}}},
    },
    "three": {
        "profiles": {
            # "off" must stay a string in the ConfigMap (bare off is YAML's false)
            "default": {"requestRatio": 0.33, "minRequest": 16777216,
                        "placement": {"swapBacking": "off"}},
            "batch": {
                "guaranteedPods": "skip",
                "resizePolicy": "keep",
                "placement": {"mode": "preferred", "weight": 10},
            },
            "ml": {"swapRatio": 1.5, "defaultLimit": "1.5Gi", "placement": {"mode": "none"}},
        },
    },
}


def _backing_off(profile: dict[str, Any]) -> dict[str, Any]:
    """What the chart makes of a profile while no node agent writes swapwise.io/swap-permille:
    swap backing "off" unless the profile decides (charts/swapwise/README.md)."""
    placement = profile.get("placement", {})
    if "swapBacking" in placement:
        return profile
    return {**profile, "placement": {**placement, "swapBacking": "off"}}


def _expected(policy_values: dict[str, Any], agent: bool = True) -> dict[str, Any]:
    profiles = {"default": {}, **policy_values.get("profiles", {})}
    expected: dict[str, Any] = {
        "apiVersion": "swapwise.io/v1alpha1",
        "kind": "SwapPolicy",
        "profiles": {k: v if agent else _backing_off(v)
                     for k, v in profiles.items() if v is not None},
    }
    if policy_values.get("namespaces"):
        expected["namespaces"] = policy_values["namespaces"]
    return expected


@pytest.mark.parametrize("case", CASES)
def test_configmap_is_the_values_policy(chart: Chart, case: str) -> None:
    policy_values = CASES[case]
    objs = chart.render({"policy": policy_values} if policy_values else None)
    cm = one(objs, "ConfigMap")
    assert cm["metadata"]["name"] == f"{RELEASE}-swapwise-policy"
    assert list(cm["data"]) == ["policy.yaml"]
    policy = yaml.safe_load(cm["data"]["policy.yaml"])
    assert policy == _expected(policy_values)
    # Same profiles, same webhook entries: they cannot drift apart.
    names = sorted(e["name"].removesuffix(".swapwise.io") for e in webhooks(objs))
    assert names == sorted(policy["profiles"])


@pytest.mark.parametrize("case", CASES)
def test_without_the_node_agent_backing_is_off_unless_a_profile_says(chart: Chart,
                                                                     case: str) -> None:
    values: dict[str, Any] = {"nodeAgent": {"enabled": False}}
    if CASES[case]:
        values["policy"] = CASES[case]
    cm = one(chart.render(values), "ConfigMap")
    assert yaml.safe_load(cm["data"]["policy.yaml"]) == _expected(CASES[case], agent=False)


def test_configmap_invents_no_fields_but_backing_off_without_the_node_agent(chart: Chart) -> None:
    for agent, default in ((True, {}), (False, {"placement": {"swapBacking": "off"}})):
        cm = one(chart.render({"nodeAgent": {"enabled": agent}}), "ConfigMap")
        assert yaml.safe_load(cm["data"]["policy.yaml"]) == {
            "apiVersion": "swapwise.io/v1alpha1",
            "kind": "SwapPolicy",
            "profiles": {"default": default},
        }


def test_notes_say_which_profiles_lost_backing_and_how_to_get_it(chart: Chart) -> None:
    values = {"policy": {"profiles": {"a": {}, "b": {"placement": {"swapBacking": "required"}},
                                      "c": {"placement": {"mode": "preferred"}}}}}
    notes = " ".join(chart.notes({**values, "nodeAgent": {"enabled": False}}).split())
    assert "Swap backing is OFF for profile(s) a, c, default:" in notes, notes
    assert "nodeAgent.enabled=true" in notes
    assert "Swap backing is OFF" not in chart.notes(values)  # the node agent runs by default


def test_deployment_mounts_the_configmap(chart: Chart) -> None:
    objs = chart.render()
    spec = one(objs, "Deployment")["spec"]["template"]["spec"]
    (vol,) = [v for v in spec["volumes"] if v["name"] == "policy"]
    assert vol["configMap"]["name"] == one(objs, "ConfigMap")["metadata"]["name"]
    args = spec["containers"][0]["args"]
    assert args[args.index("--policy") + 1] == "/etc/swapwise/policy/policy.yaml"


def _swapwise() -> Path:
    path = Path(sys.executable).parent / "swapwise"
    if not path.is_file():
        pytest.fail(f"no `swapwise` console script at {path}: install the package", pytrace=False)
    return path


@pytest.mark.parametrize("case", CASES)
def test_rendered_policy_passes_swapwise_policy_check(
    chart: Chart, case: str, tmp_path: Path
) -> None:
    """The webhook's own validator accepts what the chart writes into the ConfigMap."""
    policy_values = CASES[case]
    cm = one(chart.render({"policy": policy_values} if policy_values else None), "ConfigMap")
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(cm["data"]["policy.yaml"])
    proc = subprocess.run(
        [str(_swapwise()), "policy", "check", str(policy_file)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
