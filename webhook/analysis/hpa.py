"""HorizontalPodAutoscalers that scale on memory *utilisation*, and what reshaping does to them.

The HPA computes utilisation as usage ÷ request, summed over the pod's ``containers``
(``Resource`` metric) or for one named container (``ContainerResource``). swapwise lowers
memory requests, so the same usage reads higher by ``old request ÷ new request`` and the
HPA scales out although nothing changed. Pure: dicts in, :class:`HpaWarning` out; used by
``preview``, ``plan`` and ``audit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from webhook.base.quantity import ceil_mi, readable_bytes
from webhook.engine.pod import MalformedPod, PodView

HPA_KIND = "HorizontalPodAutoscaler"


@dataclass(frozen=True)
class MemoryUtilisation:
    """One memory metric of an HPA with ``target.type: Utilization``."""

    container: str | None  # ContainerResource: the container; Resource: None (whole pod)
    target: int  # averageUtilization, percent


@dataclass(frozen=True)
class HpaWarning:
    hpa: str  # namespace-less name of the HPA
    namespace: str | None
    target_kind: str
    target_name: str
    container: str | None
    utilisation_target: int
    request_before: int  # bytes, summed over the containers the metric covers
    request_after: int

    @property
    def factor(self) -> Fraction:
        return Fraction(self.request_before, self.request_after)

    @property
    def scaled_target(self) -> int:
        """The averageUtilization that keeps today's scaling point after reshaping."""
        return round(self.target_scaled_exact)

    @property
    def target_scaled_exact(self) -> Fraction:
        return self.utilisation_target * self.factor

    @property
    def average_value(self) -> int:
        """The AverageValue (bytes per pod) of today's target on the old request, rounded up
        to a whole MiB so it is written exactly (``1229Mi``)."""
        return ceil_mi(Fraction(self.utilisation_target * self.request_before, 100))

    def message(self) -> str:
        what = f"container {self.container}" if self.container else "the pod"
        return (
            f"HorizontalPodAutoscaler/{self.hpa} scales {self.target_kind}/{self.target_name} "
            f"on memory utilisation {self.utilisation_target}% of {what}; swapwise lowers its "
            f"memory request {readable_bytes(self.request_before)} -> "
            f"{readable_bytes(self.request_after)}, so "
            f"utilisation rises x{float(self.factor):.2f} for the same usage and the HPA "
            f"scales out: switch the metric to target.type AverageValue, averageValue "
            f"{readable_bytes(self.average_value)} (the same point), or set averageUtilization "
            f"{self.scaled_target}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "hpa": self.hpa,
            "namespace": self.namespace,
            "target": {"kind": self.target_kind, "name": self.target_name},
            "container": self.container,
            "averageUtilization": self.utilisation_target,
            "requestBefore": self.request_before,
            "requestAfter": self.request_after,
            "factor": float(self.factor),
            "suggestedAverageUtilization": self.scaled_target,
            "suggestedAverageValue": self.average_value,
        }


def is_hpa(obj: Any) -> bool:
    return (isinstance(obj, dict) and obj.get("kind") == HPA_KIND
            and str(obj.get("apiVersion", "")).startswith("autoscaling/"))


def _meta(obj: dict[str, Any], key: str) -> str | None:
    metadata = obj.get("metadata")
    value = metadata.get(key) if isinstance(metadata, dict) else None
    return value if isinstance(value, str) else None


def scale_target(hpa: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the workload the HPA scales."""
    spec = hpa.get("spec")
    ref = spec.get("scaleTargetRef") if isinstance(spec, dict) else None
    if not isinstance(ref, dict):
        return None
    kind, name = ref.get("kind"), ref.get("name")
    if isinstance(kind, str) and isinstance(name, str):
        return kind, name
    return None


def memory_utilisation_metrics(hpa: dict[str, Any]) -> list[MemoryUtilisation]:
    """The HPA's memory metrics that target Utilization (autoscaling/v2, and v1 has none:
    its only metric is CPU)."""
    spec = hpa.get("spec")
    metrics = spec.get("metrics") if isinstance(spec, dict) else None
    found: list[MemoryUtilisation] = []
    for metric in metrics if isinstance(metrics, list) else []:
        if not isinstance(metric, dict):
            continue
        kind = metric.get("type")
        if kind == "Resource":
            source, container = metric.get("resource"), None
        elif kind == "ContainerResource":
            source = metric.get("containerResource")
            container = source.get("container") if isinstance(source, dict) else None
            if not isinstance(container, str):
                continue
        else:
            continue
        if not isinstance(source, dict) or source.get("name") != "memory":
            continue
        target = source.get("target")
        if not isinstance(target, dict) or target.get("type") != "Utilization":
            continue
        value = target.get("averageUtilization")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found.append(MemoryUtilisation(container, value))
    return found


def _requests(pod: dict[str, Any], container: str | None) -> int | None:
    """Memory request summed over the pod's containers (init containers do not count for
    the HPA), or of the named one; None when one lacks a request (the HPA then cannot
    compute utilisation at all)."""
    try:
        view = PodView.parse(pod)
    except MalformedPod:
        return None
    total = Fraction(0)
    for c in view.containers:
        if c.kind != "container" or (container is not None and c.name != container):
            continue
        if c.memory_request is None or c.memory_request <= 0:
            return None
        total += c.memory_request
    return int(total) if total > 0 else None


def utilisation_warnings(
    hpa: dict[str, Any], before: dict[str, Any], after: dict[str, Any],
) -> list[HpaWarning]:
    """Warnings for ``hpa`` whose target's pod goes from ``before`` to ``after``."""
    target = scale_target(hpa)
    if target is None:
        return []
    warnings: list[HpaWarning] = []
    for metric in memory_utilisation_metrics(hpa):
        old, new = _requests(before, metric.container), _requests(after, metric.container)
        if old is None or new is None or new >= old:
            continue
        warnings.append(HpaWarning(
            hpa=_meta(hpa, "name") or "<unnamed>", namespace=_meta(hpa, "namespace"),
            target_kind=target[0], target_name=target[1], container=metric.container,
            utilisation_target=metric.target, request_before=old, request_after=new,
        ))
    return warnings


def targets(hpa: dict[str, Any], kind: str, name: str, namespace: str | None) -> bool:
    """Does ``hpa`` scale the workload ``kind/name`` (same namespace; a manifest without
    namespaces matches by name)?"""
    target = scale_target(hpa)
    if target != (kind, name):
        return False
    hpa_ns = _meta(hpa, "namespace")
    return hpa_ns is None or namespace is None or hpa_ns == namespace


def manifest_warnings(
    objects: list[Any], kind: str, name: str, namespace: str | None,
    before: dict[str, Any], after: dict[str, Any],
) -> list[HpaWarning]:
    """Warnings for the HPAs among ``objects`` (input manifests) that scale ``kind/name``,
    whose pod (template) swapwise reshapes from ``before`` to ``after``."""
    found: list[HpaWarning] = []
    for obj in objects:
        if is_hpa(obj) and targets(obj, kind, name, namespace):
            found += utilisation_warnings(obj, before, after)
    return found
