"""decide(): an AdmissionReview request in, the response and its outcome out (README
"HTTP interface"), without HTTP."""

from __future__ import annotations

import base64
import json
from typing import Any, get_args

import pytest

from testkit.pods import container, guaranteed, pod, review
from webhook.admission import OUTCOMES, Decision, Outcome, decide
from webhook.policy import build_policy, default_policy

POLICY = build_policy({
    "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
    "profiles": {"sandbox": {"swapRatio": 2}},
    "namespaces": {"team-a": {"requestRatio": 0.25}},
})


def request(obj: Any = None, **fields: Any) -> dict[str, Any]:
    """The ``request`` of a review of ``obj`` (a guaranteed pod unless given)."""
    result: dict[str, Any] = review(pod(guaranteed()) if obj is None else obj)["request"]
    result.update(fields)
    return result


def patch_of(decision: Decision) -> list[dict[str, Any]] | None:
    encoded = decision.response["response"].get("patch")
    return None if encoded is None else json.loads(base64.b64decode(encoded))


def new_request(decision: Decision) -> str | None:
    for op in patch_of(decision) or []:
        if op["path"].endswith("/resources/requests/memory"):
            value: str = op["value"]
            return value
    return None


# (case, request, profile name, outcome, containers changed, skip reason, warnings)
CASES: list[tuple[str, dict[str, Any], str, Outcome, int, str | None, int]] = [
    # one warning for the container, one for the pod's swap-backing need
    ("guaranteed pod", request(), "sandbox", "mutated", 1, None, 2),
    ("placement only: request below limit", request(pod(container(request="1Gi", limit="2Gi"))),
     "sandbox", "mutated", 0, None, 0),
    ("nothing to do: bound pod already eligible",
     request(pod(container(request="1Gi", limit="2Gi"), nodeName="node-1")),
     "sandbox", "unchanged", 0, None, 0),
    ("opted out", request(pod(guaranteed(), labels={"swapwise.io/skip": "true"})),
     "sandbox", "skipped", 0, "opted out", 0),
    ("malformed pod", request(pod(container(limit="lots"))), "sandbox", "skipped", 0,
     "malformed", 1),
    ("UPDATE", request(operation="UPDATE"), "sandbox", "ignored", 0, None, 0),
    ("DELETE", request(operation="DELETE"), "sandbox", "ignored", 0, None, 0),
    ("not a pod", request(kind={"group": "apps", "version": "v1", "kind": "Deployment"}),
     "sandbox", "ignored", 0, None, 0),
    ("pod of another group", request(kind={"group": "x.io", "version": "v1", "kind": "Pod"}),
     "sandbox", "ignored", 0, None, 0),
    ("subresource", request(subResource="status"), "sandbox", "ignored", 0, None, 0),
    ("no object", request(object=None), "sandbox", "ignored", 0, None, 0),
    ("unknown profile", request(), "nope", "unknown_profile", 0, None, 1),
]


@pytest.mark.parametrize(
    ("req", "profile", "outcome", "changed", "reason", "warnings"),
    [case[1:] for case in CASES], ids=[case[0] for case in CASES],
)
def test_decide(req: dict[str, Any], profile: str, outcome: Outcome, changed: int,
                reason: str | None, warnings: int) -> None:
    decision = decide(req, profile, POLICY)
    response = decision.response
    assert response["apiVersion"] == "admission.k8s.io/v1"
    assert response["kind"] == "AdmissionReview"
    assert response["response"]["uid"] == req["uid"] == decision.uid
    assert response["response"]["allowed"] is True
    assert decision.outcome == outcome
    assert decision.changed == changed
    assert decision.reason == reason
    assert len(decision.warnings) == warnings
    assert response["response"].get("warnings", []) == decision.warnings
    patched = outcome == "mutated"
    assert (patch_of(decision) is not None) == patched
    assert ("patchType" in response["response"]) == patched


def test_every_outcome_has_a_case() -> None:
    assert {case[3] for case in CASES} == set(OUTCOMES) == set(get_args(Outcome))


def test_unknown_profile_warning_names_it() -> None:
    decision = decide(request(), "nope", POLICY)
    assert decision.warnings == ["swapwise: unknown profile 'nope'; pod left unchanged"]


def test_namespace_override_applies() -> None:
    assert new_request(decide(request(namespace="elsewhere"), "sandbox", POLICY)) == "683Mi"
    team_a = decide(request(namespace="team-a"), "sandbox", POLICY)
    assert team_a.namespace == "team-a"
    assert new_request(team_a) == "512Mi"


def test_namespace_that_is_not_a_string_is_none() -> None:
    decision = decide(request(namespace=["team-a"]), "sandbox", POLICY)
    assert decision.namespace is None
    assert new_request(decision) == "683Mi"


def test_dry_run_gets_the_same_answer() -> None:
    live = request()
    dry = {**live, "dryRun": True}
    assert decide(dry, "sandbox", POLICY) == decide(live, "sandbox", POLICY)


def test_built_in_policy_has_the_default_profile() -> None:
    assert decide(request(), "default", default_policy()).outcome == "mutated"


def test_decision_fields_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Decision({}, "uid", "ignored")  # type: ignore[misc]
