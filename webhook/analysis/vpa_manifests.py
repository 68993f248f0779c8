"""VerticalPodAutoscalers among manifests, for ``preview`` and ``plan``.

In a cluster the webhook recognises a pod a VPA manages by the annotations the VPA admission
controller writes on it (:mod:`webhook.engine.vpa`). A manifest's pod template has none yet:
when the same input holds a VPA whose ``targetRef`` is the workload (and whose ``updateMode``
is not ``Off``), the template is handed to the engine with the annotations that VPA's webhook
would add, so ``preview`` and ``plan`` show the decision admission makes when the VPA's
webhook runs before swapwise. The VPA's own change (its recommendation) is not in any
manifest, so requests stay as written. Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
from typing import Any

from webhook.engine.vpa import OBSERVED_ANNOTATION, UPDATES_ANNOTATION

VPA_KIND = "VerticalPodAutoscaler"
VPA_GROUP = "autoscaling.k8s.io"
_MARKS = (OBSERVED_ANNOTATION, UPDATES_ANNOTATION)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def managing_vpa(
    objects: list[Any], kind: str, name: str, namespace: str | None,
) -> dict[str, Any] | None:
    """The first VPA in ``objects`` that targets ``kind/name`` and acts (mode not ``Off``)."""
    for obj in objects:
        if not isinstance(obj, dict) or obj.get("kind") != VPA_KIND:
            continue
        if not str(obj.get("apiVersion", "")).startswith(f"{VPA_GROUP}/"):
            continue
        if _dict(obj.get("metadata")).get("namespace") != namespace:
            continue
        spec = _dict(obj.get("spec"))
        ref = _dict(spec.get("targetRef"))
        if ref.get("kind") != kind or ref.get("name") != name:
            continue
        if _dict(spec.get("updatePolicy")).get("updateMode") == "Off":
            continue
        return obj
    return None


def _controlled(vpa: dict[str, Any], container: str) -> list[str]:
    """What the VPA sets on ``container``: its ``containerPolicies`` entry, or ``*``'s."""
    policies = _list(_dict(_dict(vpa.get("spec")).get("resourcePolicy")).get("containerPolicies"))
    named = [p for p in policies if isinstance(p, dict) and p.get("containerName") == container]
    wildcard = [p for p in policies if isinstance(p, dict) and p.get("containerName") == "*"]
    policy = (named or wildcard or [{}])[0]
    if policy.get("mode") == "Off":
        return []
    resources = policy.get("controlledResources")
    if not isinstance(resources, list):
        resources = ["cpu", "memory"]
    return [f"{r} request" for r in ("cpu", "memory") if r in resources]


def as_admitted(pod: dict[str, Any], vpa: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with the annotations ``vpa``'s admission controller would write on it."""
    result = copy.deepcopy(pod)
    names = [str(_dict(c).get("name")) for c in _list(_dict(result.get("spec")).get("containers"))]
    vpa_name = _dict(vpa.get("metadata")).get("name")
    updates = "; ".join(f"container {i}: {', '.join(_controlled(vpa, name))}"
                        for i, name in enumerate(names))
    metadata = result.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        return result  # malformed: the engine says so
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    annotations[OBSERVED_ANNOTATION] = ", ".join(names)
    annotations[UPDATES_ANNOTATION] = f"Pod resources updated by {vpa_name}: {updates}"
    return result


def without_admission_marks(result: dict[str, Any], original: dict[str, Any]) -> dict[str, Any]:
    """``result`` (derived from :func:`as_admitted`) without the annotations it added."""
    before = _dict(_dict(original.get("metadata")).get("annotations"))
    metadata = _dict(result.get("metadata"))
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        for key in _MARKS:
            if key not in before:
                annotations.pop(key, None)
        if not annotations and "annotations" not in _dict(original.get("metadata")):
            del metadata["annotations"]
    if not metadata and "metadata" not in original:
        result.pop("metadata", None)
    return result
