"""AdmissionReview in, AdmissionReview out: the admission decision, free of HTTP.

Like controller-runtime's webhook package, transport lives elsewhere (``server/``);
this module is a pure function of (review, profile name, policy), which is what makes
it testable without a socket and shareable with the benchmarks.
"""

from __future__ import annotations

from binascii import b2a_base64
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from webhook.base import codec
from webhook.engine import Mutation, reshape
from webhook.engine.warnings import warning
from webhook.policy import Policy

API_VERSION = "admission.k8s.io/v1"

# What happened to an admission; each value is a label of swapwise_admission_requests_total.
Outcome = Literal["mutated", "unchanged", "skipped", "ignored", "unknown_profile"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)


class InvalidReview(ValueError):
    """The body is not an ``admission.k8s.io/v1`` AdmissionReview request (HTTP 400)."""


@dataclass(frozen=True, kw_only=True, init=False)
class Decision:
    """The response to send and what happened, for logs and metrics."""

    response: dict[str, Any]
    uid: str
    outcome: Outcome
    namespace: str | None = None
    changed: int = 0
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)

    def __init__(self, *, response: dict[str, Any], uid: str, outcome: Outcome,
                 namespace: str | None = None, changed: int = 0, reason: str | None = None,
                 warnings: list[str] | None = None) -> None:
        # Still frozen, but one dict update instead of the generated __init__'s
        # object.__setattr__ per field: one is built per admission.
        self.__dict__.update(response=response, uid=uid, outcome=outcome, namespace=namespace,
                             changed=changed, reason=reason,
                             warnings=[] if warnings is None else warnings)


def parse_review(body: Any) -> dict[str, Any]:
    """The ``request`` of a v1 AdmissionReview, or :class:`InvalidReview`."""
    if not isinstance(body, dict):
        raise InvalidReview("body must be a JSON object (an AdmissionReview)")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise InvalidReview(f"expected apiVersion {API_VERSION} and kind AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise InvalidReview("request must be an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise InvalidReview("request.uid must be a non-empty string")
    return request


def _is_pod_create(request: dict[str, Any]) -> bool:
    kind = request.get("kind")
    return (
        request.get("operation") == "CREATE"
        and isinstance(kind, dict)
        and kind.get("group", "") == ""
        and kind.get("version") == "v1"
        and kind.get("kind") == "Pod"
        and not request.get("subResource")
        and isinstance(request.get("object"), dict)
    )


def review_response(
    uid: str, mutation: Mutation | None = None, warnings: list[str] | None = None
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if mutation is not None and mutation.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = b2a_base64(codec.dumps(mutation.patch), newline=False).decode()
    if warnings:
        response["warnings"] = warnings
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def decide(request: dict[str, Any], profile_name: str, policy: Policy) -> Decision:
    """Answer the ``request`` of an AdmissionReview (see :func:`parse_review`).

    ``dryRun`` needs no special case: the decision has no side effects.
    """
    uid: str = request["uid"]
    namespace = request.get("namespace")
    namespace = namespace if isinstance(namespace, str) else None
    if not _is_pod_create(request):
        return Decision(response=review_response(uid), uid=uid, outcome="ignored",
                        namespace=namespace)
    profile = policy.resolve(profile_name, namespace)
    if profile is None:
        # The policy's profiles last: a long list is what the 120-character cut drops.
        warnings = [warning(f"unknown profile {profile_name!r}; pod left unchanged; the "
                            f"policy has: {', '.join(sorted(policy.profiles))}")]
        return Decision(
            response=review_response(uid, warnings=warnings), uid=uid,
            outcome="unknown_profile", namespace=namespace, warnings=warnings,
        )
    mutation = reshape(request["object"], profile).mutation
    outcome: Outcome
    if mutation.skipped is not None:
        outcome = "skipped"
    else:
        outcome = "mutated" if mutation.patch else "unchanged"
    return Decision(
        response=review_response(uid, mutation, mutation.warnings),
        uid=uid,
        outcome=outcome,
        namespace=namespace,
        changed=len(mutation.changes),
        reason=mutation.skipped,
        warnings=mutation.warnings,
    )
