"""One reshape for every caller, and one home for the profile defaults.

The webhook, ``preview``, ``plan`` and ``audit`` all call :func:`webhook.engine.reshape`;
these tests hold the contract they share: the pod after is the patch applied (by jsonpatch,
as the API server applies it), the pod given is never changed, and the offline commands
run the engine once per workload.
"""

from __future__ import annotations

import copy
import io
from fractions import Fraction
from typing import Any

import jsonpatch
import pytest

import webhook.engine.reshaping as reshaping
from testkit.pods import container, guaranteed, pod
from webhook.analysis.planner import Node
from webhook.cli.plan_cmd import plan
from webhook.cli.preview_cmd import preview
from webhook.engine import Mutation, reshape
from webhook.policy import default_policy, parse_policy
from webhook.profile import Placement, Profile

GI = 1024**3
DEFAULT = Profile("default")


def test_after_is_the_patch_applied_and_the_pod_given_is_left_as_it_was() -> None:
    given = pod(guaranteed("2Gi"))
    kept = copy.deepcopy(given)
    result = reshape(given, DEFAULT)
    assert result.changed
    assert result.after == jsonpatch.apply_patch(kept, result.mutation.patch)
    assert result.after["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"
    assert given == kept
    assert result.after is result.after  # applied once, then kept


def test_a_pod_left_alone_is_its_own_after() -> None:
    opted_out = pod(container("app", request="1Gi", limit="1Gi"),
                    labels={"swapwise.io/skip": "true"})
    result = reshape(opted_out, DEFAULT)
    assert not result.changed
    assert result.mutation.skipped == "opted out"
    assert result.after is opted_out


def test_reshaping_the_result_again_changes_nothing() -> None:
    first = reshape(pod(guaranteed("3Gi")), DEFAULT)
    again = reshape(first.after, DEFAULT)
    assert again.mutation.patch == []


def test_a_daemonset_template_gets_no_placement() -> None:
    template = pod(guaranteed("2Gi"))
    assert reshape(template, DEFAULT).after["spec"].get("affinity")
    as_daemonset = reshape(template, DEFAULT, daemonset=True)
    assert as_daemonset.changed
    assert "affinity" not in as_daemonset.after["spec"]


def _deployment(name: str, memory: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": "sandboxes"},
            "spec": {"replicas": 2, "template": pod(guaranteed(memory))}}


@pytest.fixture
def engine_calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every call of the engine made through reshape."""
    calls: list[Any] = []
    engine = reshaping.mutate_pod

    def counting(pod: Any, profile: Profile, **kwargs: Any) -> Mutation:
        calls.append(pod)
        return engine(pod, profile, **kwargs)

    monkeypatch.setattr(reshaping, "mutate_pod", counting)
    return calls


def test_plan_and_preview_run_the_engine_once_per_workload(engine_calls: list[Any]) -> None:
    documents = [_deployment("a", "2Gi"), _deployment("b", "4Gi"),
                 {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}]
    node = Node(memory=32 * GI, swap=64 * GI, cpu=Fraction(8))
    plans = plan(documents, default_policy(), None, None, node)
    assert [p.workload.name for p in plans] == ["a", "b"]
    assert len(engine_calls) == 2
    engine_calls.clear()
    results = preview(documents, default_policy(), None, None, io.StringIO())
    assert len(engine_calls) == 2
    assert [before is after for before, after in results] == [False, False, True]


def test_an_empty_profile_in_a_policy_file_is_the_resolved_profile_s_defaults() -> None:
    policy = parse_policy("apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\n"
                          "profiles:\n  sandbox: {}\n")
    assert policy.profiles["sandbox"] == Profile("sandbox")
    assert policy.profiles["sandbox"].placement == Placement()
    assert default_policy().profiles["default"] == DEFAULT
