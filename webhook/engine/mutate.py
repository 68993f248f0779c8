"""The admission decision for one pod: skip rules, then the calculators, composed.

Pure: a pod dict and a resolved profile in, patch operations and warnings out. No I/O,
no clock, no global state, so the server, ``preview`` and ``plan`` share it and tests
exercise it without a network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webhook.engine.annotations import annotation_ops
from webhook.engine.backing import PERMILLE_LABEL, container_need
from webhook.engine.placement import placement_ops
from webhook.engine.pod import (
    PROFILE_ANNOTATION,
    SKIP_KEY,
    Exact,
    MalformedPod,
    PodTooLarge,
    PodView,
    gets_swap,
    qos_class,
)
from webhook.engine.pointer import PatchOp
from webhook.engine.resize import resize_ops
from webhook.engine.resources import ContainerChange, plan_resources, resource_ops
from webhook.engine.vpa import vpa_memory_containers
from webhook.engine.warnings import VPA_RAN_AFTER, VPA_SKIP, warning
from webhook.profile import Placement, Profile


@dataclass(frozen=True, init=False)
class Mutation:
    patch: list[PatchOp] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    changes: list[ContainerChange] = field(default_factory=list)
    skipped: str | None = None  # why the pod was left exactly as it came

    def __init__(self, patch: list[PatchOp] | None = None, warnings: list[str] | None = None,
                 changes: list[ContainerChange] | None = None, skipped: str | None = None
                 ) -> None:
        # Frozen, built with one dict update (see Decision): one per admission.
        self.__dict__.update(patch=[] if patch is None else patch,
                             warnings=[] if warnings is None else warnings,
                             changes=[] if changes is None else changes, skipped=skipped)


def skip_reason(view: PodView, profile: Profile) -> str | None:
    if view.labels.get(SKIP_KEY) == "true" or view.annotations.get(SKIP_KEY) == "true":
        return "opted out"
    if view.is_critical():
        return "critical pod"
    os_spec = view.spec.get("os")
    if isinstance(os_spec, dict) and os_spec.get("name") == "windows":
        return "windows pod"
    if profile.pod_selector is not None and not profile.pod_selector.matches(view.labels):
        return "podSelector does not match"
    if profile.guaranteed_pods == "skip" and _qos(view, []) == "Guaranteed":
        return "guaranteed pod (guaranteedPods: skip)"
    return None


def _qos(view: PodView, changes: list[ContainerChange]) -> str:
    """QoS of the pod after ``changes``."""
    if not changes:
        return view.qos_class()
    changed = {change.container.path: change for change in changes}
    units = []
    for container in view.containers:
        requests, limits = container.requests, container.limits
        change = changed.get(container.path)
        if change is not None:
            requests = {**requests, "memory": change.request}
            limits = {**limits, "memory": change.limit}
        units.append((requests, limits))
    return qos_class(units, view.pod_level_resources())


def uses_swap(view: PodView, changes: list[ContainerChange]) -> bool:
    """Will the kubelet give at least one container of the resulting pod swap?

    The rule itself is :func:`~webhook.engine.pod.gets_swap`; this applies it to the pod
    as it will be after ``changes``.
    """
    critical = view.is_critical()
    if changes and view.spec.get("resources") is None and not critical:
        # Shortcut, same answer as the rule: a changed container ends with
        # 0 < request < limit, which makes a pod without pod-level resources Burstable and
        # that container swap-eligible.
        return True
    qos = _qos(view, changes)
    changed = {change.container.path: change for change in changes}
    for container in view.containers:
        change = changed.get(container.path)
        if change is not None:
            request: Exact | None = change.request
            limit: Exact | None = change.limit
        else:
            request, limit = container.memory_request, container.memory_limit
        if gets_swap(qos, critical, request, limit):
            return True
    return False


def backing_need(changes: list[ContainerChange], placement: Placement) -> int:
    """The swap-backing need (‰) of a pod this pass reshapes: the largest over the changed
    containers of ceil(1000 x (limit - request) ÷ request); 0 when backing does not apply
    (nothing changed, placement not ``required``, or ``swapBacking: off``)."""
    if not changes or placement.mode != "required" or placement.swap_backing != "required":
        return 0
    need = 0
    for change in changes:  # a loop, not max() over a generator: one change nearly always
        container = container_need(change.request, change.limit)
        if container > need:
            need = container
    return need


# The one warning of a pod that needs backed nodes, around its need (docs/rules.md "Swap
# backing"); the rendered warning policy builds the same text from these two parts.
BACKING_WARNING = ("needs nodes whose swap is >= ",
                   f"\u2030 of their RAM (node label {PERMILLE_LABEL}, from the node agent)")


def backing_warning(need: int) -> str:
    return warning(f"{BACKING_WARNING[0]}{need}{BACKING_WARNING[1]}")


VPA_SKIPPED = "managed by a VerticalPodAutoscaler (vpaPods: skip)"


def _vpa_skip_warning(view: PodView) -> str:
    if view.annotations.get(PROFILE_ANNOTATION) is not None:
        # Reinvoked after the VPA's webhook: our first pass came before it (webhook order),
        # and the VPA has since set the requests, scaling the limits in proportion.
        return warning(VPA_RAN_AFTER)
    return warning(VPA_SKIP)


def mutate_pod(
    pod: Any, profile: Profile, *, daemonset: bool | None = None
) -> Mutation:
    """Reshape ``pod`` for swap per ``profile``; a second pass over the result is empty.

    ``daemonset`` overrides owner detection, for pod templates that have no owner yet.
    """
    try:
        view = PodView.parse(pod)
        reason = skip_reason(view, profile)
        if reason is not None:
            return Mutation(skipped=reason)
        vpa_managed = vpa_memory_containers(view) or frozenset()
        if vpa_managed and profile.vpa_pods == "skip":
            return Mutation(warnings=[_vpa_skip_warning(view)], skipped=VPA_SKIPPED)
        changes, warnings = plan_resources(view, profile, vpa_managed)
        patch = [op for change in changes for op in resource_ops(change)]
        ops, resize_warnings = resize_ops(view, changes, profile)
        patch += ops
        warnings += resize_warnings
        if daemonset is None:
            daemonset = view.owned_by_daemonset()
        if not view.spec.get("nodeName") and not daemonset and uses_swap(view, changes):
            need = backing_need(changes, profile.placement)
            patch += placement_ops(view, profile.placement, need)
            if need:
                warnings.append(backing_warning(need))
        if patch:
            ops, annotation_warnings = annotation_ops(view, profile.name, changes)
            patch += ops
            warnings += annotation_warnings
        return Mutation(patch, warnings, changes)
    except PodTooLarge as exc:
        return Mutation(warnings=[warning(f"pod left unchanged: {exc}")], skipped="too large")
    except MalformedPod as exc:
        return Mutation(warnings=[warning(f"pod left unchanged: {exc}")], skipped="malformed")

