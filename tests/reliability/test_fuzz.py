"""Fuzzing AdmissionReviews through the real ASGI app, in-process, for volume.

Every example checks what the API server relies on: never a 5xx and never a hang; a
200 is a well-formed review response for the same uid; a patch applies (RFC 6902, with
jsonpatch) and touches only what docs/rules.md allows; a patched valid pod is still valid for
the Kubernetes 1.34 schema; a second pass over the result patches nothing.
SWAPWISE_FUZZ_LONG=1 runs 50x the examples.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testkit.strategies import pods, profiles
from tests.reliability.reviews import (
    EXAMPLE_PODS,
    broken_reviews,
    fuzz,
    mutated_example_pods,
)
from tests.reliability.support import (
    InProcess,
    apply_checked,
    check_reply,
    patch_of,
    review_bytes,
    validate,
)
from webhook.policy import Policy
from webhook.profile import Profile


@pytest.fixture(scope="module")
def app() -> Iterator[InProcess]:
    harness = InProcess()
    yield harness
    harness.close()


def admit(app: InProcess, pod: Any, profile: str, namespace: str = "ns") -> dict[str, Any]:
    reply = app.post(review_bytes(pod, uid="u-1", namespace=namespace), profile)
    response = check_reply(reply, "u-1")
    assert response is not None, reply.body[:300]
    return response


@fuzz(600)
@given(pod=pods(), profile=profiles(), namespace=st.sampled_from(["ns", "team-a"]))
def test_generated_pods_stay_valid_and_invariants_hold(
    app: InProcess, pod: dict[str, Any], profile: Profile, namespace: str
) -> None:
    validate(pod)  # the generator's pods are valid to begin with
    app.use(Policy(profiles={"prop": profile}))
    original = copy.deepcopy(pod)
    response = admit(app, pod, "prop", namespace)
    result = apply_checked(pod, response)
    assert pod == original
    if result is not pod:
        validate(result)
    assert patch_of(admit(app, result, "prop", namespace)) == [], "second pass must be empty"


@fuzz(1500)
@given(pod=mutated_example_pods(), profile=profiles())
def test_mutated_real_pods_never_fail(
    app: InProcess, pod: dict[str, Any], profile: Profile
) -> None:
    app.use(Policy(profiles={"prop": profile}))
    reply = app.post(review_bytes(pod, uid="u-2"), "prop")
    response = check_reply(reply, "u-2")
    assert response is not None
    result = apply_checked(pod, response)
    if result is not pod:
        assert patch_of(admit(app, result, "prop")) == [], "second pass must be empty"


@fuzz(1500)
@given(body=broken_reviews(), profile=st.sampled_from(["default", "missing"]))
def test_broken_reviews_get_a_4xx_or_an_allowed_answer(
    app: InProcess, body: bytes, profile: str
) -> None:
    app.use(Policy(profiles={"default": Profile(name="default")}))
    response = check_reply(app.post(body, profile))
    if response is not None:
        parsed = json.loads(body)
        assert response["uid"] == parsed["request"]["uid"]
        obj = parsed["request"].get("object")
        if patch_of(response):
            apply_checked(obj, response)


@fuzz(500)
@given(body=st.binary(max_size=2000), chunks=st.integers(1, 5),
       declare_length=st.booleans())
def test_random_bytes_are_refused_cleanly(
    app: InProcess, body: bytes, chunks: int, declare_length: bool
) -> None:
    reply = app.post(body, "default", chunks=chunks, declare_length=declare_length)
    assert reply.status in (200, 400), reply.body[:200]
    check_reply(reply)


def nested_text(depth: int, kind: str) -> str:
    """JSON text nested ``depth`` levels (built as text: encoders have depth limits too)."""
    if kind == "list":
        return "[" * depth + '"x"' + "]" * depth
    return '{"a":' * depth + '"x"' + "}" * depth


@fuzz(60)
@given(depth=st.integers(1, 5000), kind=st.sampled_from(["list", "dict"]),
       where=st.sampled_from(["label", "values", "affinity", "toleration", "memory", "body"]))
def test_deeply_nested_values_anywhere(app: InProcess, depth: int, kind: str, where: str) -> None:
    pod = copy.deepcopy(EXAMPLE_PODS[0])
    deep = nested_text(depth, kind)
    if where == "body":
        check_reply(app.post(deep.encode(), "default"))
        return
    marker = "@@deep@@"
    if where == "label":
        pod["metadata"]["labels"] = {"deep": marker}
    elif where == "values":  # copied into the patch when placement extends the term
        terms = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": marker}]}]
        pod["spec"]["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    elif where == "affinity":
        pod["spec"]["affinity"] = marker
    elif where == "toleration":
        pod["spec"]["tolerations"] = [{"key": "k", "operator": "Exists", "x": marker}]
    else:
        pod["spec"]["containers"][0]["resources"] = {"limits": {"memory": marker}}
    content = review_bytes(pod).replace(f'"{marker}"'.encode(), deep.encode())
    response = check_reply(app.post(content, "default"))
    if response is not None and patch_of(response) and depth < 500:
        apply_checked(json.loads(content)["request"]["object"], response)


def test_a_thousand_containers_are_all_reshaped(app: InProcess) -> None:
    pod = copy.deepcopy(EXAMPLE_PODS[-1])  # sandbox-pod.yaml: one Guaranteed container
    template = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**copy.deepcopy(template), "name": f"c{i}"}
                                 for i in range(1000)]
    app.use(Policy(profiles={"default": Profile(name="default")}))
    response = admit(app, pod, "default")
    result = apply_checked(pod, response)
    validate(result)
    requests = {c["resources"]["requests"]["memory"] for c in result["spec"]["containers"]}
    assert requests == {"683Mi"}
    # one per container, and the pod's swap-backing need
    assert len(response["warnings"]) == 1001
    assert response["warnings"][-1].startswith("swapwise: needs nodes whose swap is >= 1999")


@pytest.mark.parametrize("size", [3 * 1024 * 1024 + 1, 8 * 1024 * 1024])
@pytest.mark.parametrize("declare_length", [True, False])
def test_huge_bodies_are_413(app: InProcess, size: int, declare_length: bool) -> None:
    body = b'{"apiVersion": "' + b"x" * size + b'"}'
    reply = app.post(body, "default", chunks=16, declare_length=declare_length)
    assert reply.status == 413
    assert json.loads(reply.body)["code"] == 413


@pytest.mark.parametrize("text", [
    b"[" * 200_000,
    b'{"a":' * 100_000,
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":' + b"[" * 50_000,
    b"1" * 100_000,
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"'
    + b"\\ud800" + b'"}}',
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"a",'
    b'"operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"object":{"spec":'
    b'{"containers":[{"name":"c","resources":{"limits":{"memory":1e400}}}]}}}}',
    b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"a",'
    b'"operation":"CREATE","kind":{"version":"v1","kind":"Pod"},"object":{"spec":'
    b'{"containers":[{"name":"c","resources":{"limits":{"memory":' + b"9" * 5000 + b"}}}]}}}}",
])
def test_pathological_json_is_answered(app: InProcess, text: bytes) -> None:
    check_reply(app.post(text, "default"))


def test_giant_strings_make_short_warnings(app: InProcess) -> None:
    pod = copy.deepcopy(EXAMPLE_PODS[-1])
    pod["spec"]["containers"][0]["name"] = "n" * 1_000_000
    response = admit(app, pod, "default")
    assert response["warnings"] and all(len(w) <= 120 for w in response["warnings"])
    apply_checked(pod, response)
