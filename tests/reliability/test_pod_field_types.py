"""Any JSON type in any field the engine reads: the pod is malformed (allowed unchanged,
with a warning) or reshaped, never the internal-error path. Junk in swapwise's own
annotation is ignored with a warning and the pod reshaped normally.

Before this suite: ``spec.priorityClassName`` as a list or object raised TypeError, and
``swapwise.io/original`` holding deeply nested JSON raised RecursionError; both answered
"internal error; pod unchanged", so a user could make a pod escape reshaping.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.reviews import fuzz, json_values, paths
from tests.reliability.support import InProcess, check_reply, patch_of, review_bytes
from webhook.policy import Policy
from webhook.profile import LabelSelector, Placement, Profile

TOLERATION = {"key": "swap", "operator": "Exists", "effect": "NoSchedule"}
EXPRESSION = {"key": "zone", "operator": "In", "values": ["a"]}


def base_pod() -> dict[str, Any]:
    """A Guaranteed pod that has every field the engine reads."""
    resources = {"requests": {"memory": "2Gi", "cpu": "1"}, "limits": {"memory": "2Gi", "cpu": "1"}}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "p", "namespace": "ns",
            "labels": {"app": "web", "swapwise.io/skip": "false"},
            "annotations": {"swapwise.io/skip": "false", "swapwise.io/profile": "default",
                            "swapwise.io/original": json.dumps({"old": {"request": "1Gi"}}),
                            "kubernetes.io/config.mirror": "x"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs",
                                 "uid": "u"}],
        },
        "spec": {
            "priorityClassName": "normal", "priority": 0, "nodeName": "",
            "restartPolicy": "Always", "os": {"name": "linux"},
            "resources": {"requests": {"memory": "4Gi"}, "limits": {"memory": "4Gi"}},
            "initContainers": [{"name": "side", "image": "x", "restartPolicy": "Always",
                                "resources": copy.deepcopy(resources),
                                "resizePolicy": [{"resourceName": "memory",
                                                  "restartPolicy": "NotRequired"}]}],
            "containers": [{"name": "app", "image": "x", "resources": copy.deepcopy(resources),
                            "resizePolicy": [{"resourceName": "cpu",
                                              "restartPolicy": "NotRequired"}]}],
            "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [copy.deepcopy(EXPRESSION)]}]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [copy.deepcopy(EXPRESSION)]}}],
            }},
            "tolerations": [copy.deepcopy(TOLERATION)],
        },
    }


# Every field of base_pod() except the two the engine never reads.
FIELDS = [p for p in paths(base_pod()) if p and p[-1] not in ("image", "apiVersion")
          and p[:2] != ("metadata", "name")]

PROFILES = {
    "required": Profile(name="required", placement=Placement(
        tolerations=(TOLERATION, {"key": "other", "operator": "Exists"}))),
    "preferred": Profile(name="preferred", placement=Placement(mode="preferred")),
    "selector": Profile(name="selector", pod_selector=LabelSelector(
        match_labels=(("app", "web"),),
        match_expressions=(("tier", "NotIn", ("db",)),))),
}

odd_values = st.one_of(
    json_values,
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from(["", "\u0663Gi", "1Gi\n", " 2Gi", "1e999999999", "Always", "Never",
                     "memory", "RestartContainer", "DaemonSet", "system-node-critical",
                     "true", "windows", "[]", "{}", "[" * 5000 + "]" * 5000,
                     '{"app": {"request": 5}}']),
    st.just([[[[[[[[[[[]]]]]]]]]]]),
)


@pytest.fixture(scope="module")
def app() -> Iterator[InProcess]:
    harness = InProcess(Policy(profiles=PROFILES))
    yield harness
    harness.close()


def admit(app: InProcess, pod: Any, profile: str) -> dict[str, Any]:
    reply = app.post(review_bytes(pod, uid="u-types"), profile)
    response = check_reply(reply, "u-types")
    assert response is not None, reply.body[:300]
    for message in response.get("warnings", []):
        assert "internal error" not in message, (message, pod)
    return response


def errors(app: InProcess) -> float:
    total = 0.0
    for metric in app.state.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name == "swapwise_admission_requests_total" \
                    and sample.labels["outcome"] == "error":
                total += sample.value
    return total


@fuzz(1500)
@given(data=st.data(), profile=st.sampled_from(sorted(PROFILES)))
def test_any_type_in_any_field_never_reaches_the_error_path(
    app: InProcess, data: st.DataObject, profile: str
) -> None:
    pod = base_pod()
    for path in data.draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3)):
        parent: Any = pod
        try:
            for key in path[:-1]:
                parent = parent[key]
            parent[path[-1]] = data.draw(odd_values)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed the parent
    response = admit(app, pod, profile)
    jsonpatch.apply_patch(copy.deepcopy(pod), patch_of(response))  # applies
    assert errors(app) == 0


@pytest.mark.parametrize("value", [["system-node-critical"], {"a": 1}, 5, True])
def test_priority_class_name_of_another_type_is_a_malformed_pod(app: InProcess,
                                                                value: Any) -> None:
    pod = base_pod()
    pod["spec"]["priorityClassName"] = value
    response = admit(app, pod, "required")
    assert "patch" not in response
    assert any("priorityClassName must be a string" in w for w in response["warnings"])


@pytest.mark.parametrize("junk", [
    "[" * 100_000 + "]" * 100_000,  # RecursionError in json.loads
    "{" + '"a":{' * 5000 + "}" * 5001,
    "not json", "[]", "5", json.dumps({"app": "x"}), json.dumps({"app": {"request": 1}}),
])
def test_junk_in_the_original_annotation_is_ignored_and_the_pod_reshaped(
    app: InProcess, junk: str
) -> None:
    pod = base_pod()
    del pod["metadata"]["annotations"]["kubernetes.io/config.mirror"]
    pod["metadata"]["annotations"]["swapwise.io/original"] = junk
    response = admit(app, pod, "required")
    ops = patch_of(response)
    assert any(op["path"] == "/spec/containers/0/resources/requests/memory" for op in ops)
    assert any("ignored unreadable swapwise.io/original" in w for w in response["warnings"])
    [written] = [op["value"] for op in ops
                 if op["path"] == "/metadata/annotations/swapwise.io~1original"]
    assert json.loads(written)["app"] == {"request": "2Gi", "limit": "2Gi"}


def test_a_non_string_original_annotation_is_ignored_too(app: InProcess) -> None:
    pod = base_pod()
    del pod["metadata"]["annotations"]["kubernetes.io/config.mirror"]
    pod["metadata"]["annotations"]["swapwise.io/original"] = {"deep": [[[[]]]]}
    response = admit(app, pod, "required")
    assert any("ignored unreadable" in w for w in response["warnings"])
    assert base64.b64decode(response["patch"])
