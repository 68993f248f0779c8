"""Which pods reach swapwise at all: namespace opt-in and the skip rules, stated once.

A namespace opts in with the label :data:`NAMESPACE_LABEL` = ``<profile>``; the namespaces
of :data:`ALWAYS_EXCLUDED_NAMESPACES` are never matched; and pods the engine would leave
alone anyway (:func:`webhook.engine.mutate.skip_reason`: critical, mirror, Windows or
opted-out pods) are filtered before the API server calls the webhook, so that a webhook
outage can never touch them. The engine decides with the same constants (engine/pod.py);
``render/`` writes them into the admission policies and ``audit`` reads namespaces with
them; the chart's MutatingWebhookConfiguration states them in its template, and
tests/chart checks that it says exactly what :func:`webhook_match_conditions`,
:func:`excluded_namespaces` and the keys here say.
"""

from __future__ import annotations

from collections.abc import Sequence

from webhook.engine.pod import (
    CRITICAL_CLASSES,
    CRITICAL_PRIORITY,
    MIRROR_ANNOTATION,
    PROFILE_ANNOTATION,
    SKIP_KEY,
)

# One key for both: the label that opts a namespace in, the annotation on a reshaped pod.
NAMESPACE_LABEL = PROFILE_ANNOTATION
NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace
# Kubernetes' own: nothing there is ever reshaped (the chart adds its release namespace).
ALWAYS_EXCLUDED_NAMESPACES = ("kube-system", "kube-node-lease")


def excluded_namespaces(release_namespace: str | None, extra: Sequence[str] = ()) -> list[str]:
    """The namespaces a webhook entry never matches, in the chart's order: its own
    release namespace first, then Kubernetes', then what the user adds; no repeats."""
    names = [release_namespace] if release_namespace else []
    names += [*ALWAYS_EXCLUDED_NAMESPACES, *extra]
    return list(dict.fromkeys(names))


def _quoted(values: Sequence[str]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


def webhook_match_conditions() -> list[dict[str, str]]:
    """The MutatingWebhookConfiguration's ``matchConditions``: the engine's skip rules in
    the CEL of a webhook entry (no optional types; ``has()`` guards every field). The
    skip *label* is the entry's ``objectSelector`` instead, which needs no CEL."""
    return [
        {"name": "not-critical-priority-class",
         "expression": "!has(object.spec.priorityClassName) || "
                       "!(object.spec.priorityClassName in "
                       f"{_quoted(sorted(CRITICAL_CLASSES))})"},
        {"name": "not-critical-priority",
         "expression": "!has(object.spec.priority) || "
                       f"object.spec.priority < {CRITICAL_PRIORITY}"},
        {"name": "not-mirror-pod",
         "expression": "!has(object.metadata.annotations) || "
                       f"!('{MIRROR_ANNOTATION}' in object.metadata.annotations)"},
        {"name": "not-skip-annotated",
         "expression": "!has(object.metadata.annotations) || "
                       f"!('{SKIP_KEY}' in object.metadata.annotations) || "
                       f"object.metadata.annotations['{SKIP_KEY}'] != 'true'"},
        {"name": "not-windows",
         "expression": "!has(object.spec.os) || object.spec.os.name != 'windows'"},
    ]
