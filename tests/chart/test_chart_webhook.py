"""The MutatingWebhookConfiguration: one entry per profile, selectors, conditions, knobs."""

from __future__ import annotations

from typing import Any

import celpy
import pytest
from chartlib import NAMESPACE, RELEASE, Chart, one, webhooks

from webhook.engine.pod import SKIP_KEY
from webhook.engine.selection import (
    NAME_LABEL,
    NAMESPACE_LABEL,
    excluded_namespaces,
    webhook_match_conditions,
)

THREE = {
    "policy": {
        "profiles": {
            "default": None,
            "sandbox": {"swapRatio": 2},
            "batch": {"requestRatio": 0.5},
            "dev": {},
        }
    }
}


def test_default_values_give_one_default_entry(chart: Chart) -> None:
    (entry,) = webhooks(chart.render())
    assert entry["name"] == "default.swapwise.io"
    assert entry["clientConfig"]["service"] == {
        "name": f"{RELEASE}-swapwise",
        "namespace": NAMESPACE,
        "port": 443,
        "path": "/mutate/default",
    }


@pytest.mark.parametrize(
    "profiles",
    [
        {"sandbox": {"swapRatio": 2}, "batch": {"requestRatio": 0.5}},
        {"sandbox": {"swapRatio": 2}, "batch": {"requestRatio": 0.5}, "dev": {}},
    ],
    ids=["2-profiles", "3-profiles"],
)
def test_one_entry_per_profile(chart: Chart, profiles: dict[str, Any]) -> None:
    values = {"policy": {"profiles": {"default": None, **profiles}}}
    entries = webhooks(chart.render(values))
    assert sorted(e["name"] for e in entries) == sorted(f"{p}.swapwise.io" for p in profiles)
    for entry in entries:
        profile = entry["name"].removesuffix(".swapwise.io")
        assert len(entry["name"].split(".")) >= 3
        assert entry["clientConfig"]["service"]["path"] == f"/mutate/{profile}"
        first = entry["namespaceSelector"]["matchExpressions"][0]
        assert first == {"key": "swapwise.io/profile", "operator": "In", "values": [profile]}


def test_values_file_adding_profiles_keeps_default_unless_nulled(chart: Chart) -> None:
    merged = webhooks(chart.render({"policy": {"profiles": {"sandbox": {}}}}))
    assert sorted(e["name"] for e in merged) == ["default.swapwise.io", "sandbox.swapwise.io"]
    only = webhooks(chart.render({"policy": {"profiles": {"default": None, "sandbox": {}}}}))
    assert [e["name"] for e in only] == ["sandbox.swapwise.io"]


def test_fixed_fields_of_every_entry(chart: Chart) -> None:
    for entry in webhooks(chart.render(THREE)):
        assert entry["admissionReviewVersions"] == ["v1"]
        assert entry["sideEffects"] == "None"
        assert entry["reinvocationPolicy"] == "IfNeeded"
        assert entry["failurePolicy"] == "Ignore"
        assert entry["timeoutSeconds"] == 5
        assert entry["rules"] == [
            {
                "operations": ["CREATE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["pods"],
                "scope": "Namespaced",
            }
        ]
        assert entry["objectSelector"] == {
            "matchExpressions": [
                {"key": "swapwise.io/skip", "operator": "NotIn", "values": ["true"]}
            ]
        }


@pytest.mark.parametrize(("policy", "timeout"), [("Fail", 1), ("Ignore", 30), ("Fail", 12)])
def test_failure_policy_and_timeout_from_values(chart: Chart, policy: str, timeout: int) -> None:
    values = {**THREE, "webhook": {"failurePolicy": policy, "timeoutSeconds": timeout}}
    for entry in webhooks(chart.render(values)):
        assert entry["failurePolicy"] == policy
        assert entry["timeoutSeconds"] == timeout


def test_namespace_exclusions(chart: Chart) -> None:
    values = {**THREE, "webhook": {"excludeNamespaces": ["monitoring", "kube-system"]}}
    for entry in webhooks(chart.render(values, namespace="webhooks")):
        not_in = entry["namespaceSelector"]["matchExpressions"][1]
        assert not_in["key"] == "kubernetes.io/metadata.name"
        assert not_in["operator"] == "NotIn"
        # release namespace, the system ones, the extra ones; each once.
        assert not_in["values"] == ["webhooks", "kube-system", "kube-node-lease", "monitoring"]
        assert len(entry["namespaceSelector"]["matchExpressions"]) == 2


def test_out_of_cluster_url(chart: Chart) -> None:
    values = {**THREE, "webhook": {"url": "https://127.0.0.1:8443/"}}
    objs = chart.render(values)
    for entry in webhooks(objs):
        profile = entry["name"].removesuffix(".swapwise.io")
        assert entry["clientConfig"]["url"] == f"https://127.0.0.1:8443/mutate/{profile}"
        assert "service" not in entry["clientConfig"]
        assert entry["clientConfig"]["caBundle"]
    # Nothing in-cluster serves it: no workload objects (but the node agent's, on by default).
    kinds = {o["kind"] for o in objs
             if o["metadata"]["labels"].get("app.kubernetes.io/component") != "node-agent"}
    assert kinds == {"ConfigMap", "Secret", "MutatingWebhookConfiguration"}


# ---- matchConditions: evaluated with a CEL interpreter on sample pods ---------------------


def _pod(*, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "namespace": "team"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "app", "image": "x"}], **spec},
    }


CALLED = {
    "plain": _pod(),
    "ordinary priority": _pod(priority=1000, priorityClassName="high"),
    "just below critical": _pod(priority=1999999999),
    "other annotations": _pod(annotations={"a": "b"}),
    "skip false": _pod(annotations={"swapwise.io/skip": "false"}),
    "linux": _pod(os={"name": "linux"}),
}
NOT_CALLED = {
    "system-cluster-critical": _pod(priorityClassName="system-cluster-critical"),
    "system-node-critical": _pod(priorityClassName="system-node-critical", priority=2000001000),
    "priority at threshold": _pod(priority=2000000000),
    "mirror pod": _pod(annotations={"kubernetes.io/config.mirror": "abc"}),
    "skip annotation": _pod(annotations={"swapwise.io/skip": "true"}),
    "windows": _pod(os={"name": "windows"}),
}


def _conditions_pass(entry: dict[str, Any], pod: dict[str, Any]) -> bool:
    env = celpy.Environment()
    activation = {"object": celpy.json_to_cel(pod)}
    results = [
        bool(env.program(env.compile(c["expression"])).evaluate(activation))
        for c in entry["matchConditions"]
    ]
    return all(results)


@pytest.fixture(scope="module")
def entry(chart: Chart) -> dict[str, Any]:
    return webhooks(chart.render())[0]


@pytest.mark.parametrize("extra", [[], ["team-x", "kube-system"]], ids=["default", "extra"])
def test_the_chart_states_the_engine_s_selection_rules(chart: Chart, extra: list[str]) -> None:
    """The chart's template says what webhook.engine.selection says: the match conditions
    word for word, the opt-in label, the skip label and the excluded namespaces in order."""
    values = {"webhook": {"excludeNamespaces": extra}} if extra else {}
    (entry,) = webhooks(chart.render(values))
    assert entry["matchConditions"] == webhook_match_conditions()
    by_key = {e["key"]: e for e in entry["namespaceSelector"]["matchExpressions"]}
    assert by_key.keys() == {NAMESPACE_LABEL, NAME_LABEL}
    assert by_key[NAMESPACE_LABEL] == {"key": NAMESPACE_LABEL, "operator": "In",
                                       "values": ["default"]}
    assert by_key[NAME_LABEL]["operator"] == "NotIn"
    assert by_key[NAME_LABEL]["values"] == excluded_namespaces(NAMESPACE, extra)
    assert entry["objectSelector"] == {"matchExpressions": [
        {"key": SKIP_KEY, "operator": "NotIn", "values": ["true"]}]}


def test_match_conditions_are_named_and_unique(entry: dict[str, Any]) -> None:
    names = [c["name"] for c in entry["matchConditions"]]
    assert len(names) == len(set(names)) >= 3
    text = " ".join(c["expression"] for c in entry["matchConditions"])
    assert "has(object.spec.priority)" in text
    assert "2000000000" in text
    assert "system-cluster-critical" in text and "system-node-critical" in text


@pytest.mark.parametrize("name", CALLED)
def test_match_conditions_call_webhook_for(entry: dict[str, Any], name: str) -> None:
    assert _conditions_pass(entry, CALLED[name])


@pytest.mark.parametrize("name", NOT_CALLED)
def test_match_conditions_skip(entry: dict[str, Any], name: str) -> None:
    assert not _conditions_pass(entry, NOT_CALLED[name])


def test_configuration_is_cluster_scoped_and_named_for_release(chart: Chart) -> None:
    mwc = one(chart.render(), "MutatingWebhookConfiguration")
    assert mwc["metadata"]["name"] == f"{RELEASE}-swapwise"
    assert "namespace" not in mwc["metadata"]
