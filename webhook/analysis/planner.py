"""Capacity math for ``swapwise plan``: what reshaping does to density on one node shape.

Pure: a reshaped pod and a node shape in, numbers out. The reshape is the same
:func:`~webhook.engine.reshape` the webhook runs, so the plan can never disagree with what
admission will do. The formulas mirror the components that decide:

- swap share of a container (kubelet, LimitedSwap): ``floor(request / memoryCapacity *
  swapCapacity)``, and only for containers of Burstable, non-critical pods whose memory
  request differs from their limit;
- pod requests (scheduler): ``max(sum(containers + sidecars), max over init containers of
  (init request + sidecars started before it))``, or the pod-level request when set, plus
  the pod overhead (``spec.overhead``, from the pod's RuntimeClass; see
  :mod:`webhook.analysis.overhead`).

Which container gets swap is :func:`~webhook.engine.pod.gets_swap`, the rule the webhook's
placement uses too.

Swap backing (:mod:`webhook.engine.backing`): the pod's ``need`` (the largest, over the
containers swapwise changes, of ceil(1000 * (limit - request) / request)) against the node's
``swapwise.io/swap-permille``. Where the profile's placement requires backing, the scheduler
puts none of the pods on a node that does not back them, so such a node fits 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

from webhook.analysis.overhead import NO_OVERHEAD, Overhead, RuntimeClass, pod_overhead
from webhook.base.quantity import MI, ceil_mi
from webhook.engine import Reshape, backing
from webhook.engine.mutate import Mutation, uses_swap
from webhook.engine.pod import ContainerView, MalformedPod, PodView
from webhook.profile import Profile

DEFAULT_MAX_PODS = 110  # the kubelet's default maxPods


class PlanError(ValueError):
    """Input the plan cannot be computed for (a node shape that is not a node)."""


@dataclass(frozen=True)
class Node:
    """The node shape to plan for.

    ``memory`` is the machine capacity: the kubelet divides swap by it. Scheduling uses
    ``allocatable_memory`` (capacity minus reservations) when given.
    """

    memory: int
    swap: int
    cpu: Fraction
    allocatable_memory: int | None = None
    max_pods: int = DEFAULT_MAX_PODS

    def __post_init__(self) -> None:
        if self.memory <= 0:
            raise PlanError("node memory must be greater than zero")
        if self.swap < 0:
            raise PlanError("node swap must not be negative")
        if self.cpu <= 0:
            raise PlanError("node cpu must be greater than zero")
        if self.allocatable_memory is not None and not 0 < self.allocatable_memory <= self.memory:
            raise PlanError("allocatable memory must be greater than zero and at most the memory")
        if self.max_pods < 1:
            raise PlanError("max pods must be at least 1")

    @property
    def schedulable_memory(self) -> int:
        return self.memory if self.allocatable_memory is None else self.allocatable_memory

    @property
    def swap_ratio(self) -> Fraction:
        """Node swap ÷ node RAM: the ``swapRatio`` whose requests exactly fit this node."""
        return Fraction(self.swap, self.memory)

    @property
    def permille(self) -> int:
        """The ``swapwise.io/swap-permille`` label the node agent gives a node of this shape
        (all of its swap backing: disk)."""
        return backing.node_permille(self.swap, self.memory)

    def swap_share(self, request: int) -> int:
        """Swap the kubelet gives a swap-eligible container with this memory request."""
        return backing.swap_share(request, self.swap, self.memory)

    def fit_request(self, limit: int) -> int:
        """Smallest whole-MiB request whose swap share holds the cold memory of ``limit``."""
        request = ceil_mi(Fraction(limit * self.memory, self.memory + self.swap))
        while limit - request > self.swap_share(request):  # the kubelet floors the share
            request += MI
        return request


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    kind: str  # init | sidecar | container
    request_before: int | None  # effective memory request (a missing one copies the limit)
    limit_before: int | None
    request_after: int | None
    limit_after: int | None
    swap_eligible: bool  # after reshaping
    swap_share: int  # bytes of swap on the node, after reshaping
    fit_request: int | None  # smallest request whose share holds the cold memory

    @property
    def changed(self) -> bool:
        return (self.request_before, self.limit_before) != (self.request_after, self.limit_after)

    @property
    def cold(self) -> int | None:
        """Memory above the request (limit - request): what must fit in swap."""
        if self.limit_after is None or self.request_after is None:
            return None
        return max(self.limit_after - self.request_after, 0)

    @property
    def fits(self) -> bool | None:
        """Does the cold memory fit the swap share? None when it does not apply."""
        if not self.swap_eligible or self.cold is None:
            return None
        return self.cold <= self.swap_share

    @property
    def needed_swap_ratio(self) -> Fraction | None:
        """The node swap/RAM ratio at which this container's cold memory would fit."""
        if not self.swap_eligible or self.cold is None or not self.request_after:
            return None
        return Fraction(self.cold, self.request_after)


def backing_applies(profile: Profile) -> bool:
    """Does ``profile``'s placement require swap backing (``placement.mode: required`` and
    ``placement.swapBacking: required``)?"""
    return backing_off(profile) is None


def backing_off(profile: Profile) -> str | None:
    """Why ``profile``'s placement does not require swap backing; None when it does."""
    placement = profile.placement
    if placement.mode != "required":
        return f"placement.mode: {placement.mode}"
    if placement.swap_backing != "required":
        return "placement.swapBacking: off"
    return None


@dataclass(frozen=True)
class Backing:
    """The pod's need against the node's per-mille, and whether the scheduler enforces it.

    ``off`` says why it is not enforced for this pod (None when it is): the profile turns it
    off, or the webhook adds no swap-node placement to the pod at all.
    """

    need: int  # per mille of a request, the largest over the containers swapwise changes
    node_permille: int
    off: str | None

    @property
    def applies(self) -> bool:
        return self.off is None

    @property
    def backed(self) -> bool:
        return backing.backed(self.need, self.node_permille)

    @property
    def refused(self) -> bool:
        """The scheduler places none of these pods on this node."""
        return self.applies and not self.backed


@dataclass(frozen=True)
class Density:
    """How many of one pod a node holds, per resource, and which one runs out first.

    ``memory_request`` and ``cpu_request`` are what the scheduler reserves: the pod's
    requests plus its overhead (``overhead_memory``, ``overhead_cpu``). ``unbacked``: the
    node does not back the pod and its placement requires backing, so it holds none
    (``backing`` is then the count that binds, at 0).
    """

    memory_request: int
    cpu_request: Fraction
    by_memory: int | None  # None: no request, so memory never stops the scheduler
    by_cpu: int | None
    by_pods: int
    overhead_memory: int = 0
    overhead_cpu: Fraction = Fraction(0)
    unbacked: bool = False

    @property
    def counts(self) -> dict[str, int]:
        counts = {"memory": self.by_memory, "cpu": self.by_cpu, "pods": self.by_pods,
                  "backing": 0 if self.unbacked else None}
        return {name: count for name, count in counts.items() if count is not None}

    @property
    def per_node(self) -> int:
        return min(self.counts.values())

    @property
    def binds(self) -> tuple[str, ...]:
        """The resources exhausted first (several on a tie)."""
        return tuple(name for name, count in self.counts.items() if count == self.per_node)

    def nodes_for(self, replicas: int) -> int | None:
        """Nodes needed for ``replicas`` pods; None when not even one fits."""
        return math.ceil(replicas / self.per_node) if self.per_node else None


@dataclass(frozen=True)
class PodPlan:
    containers: tuple[ContainerPlan, ...]
    before: Density
    after: Density
    swap_ratio: Fraction  # the node's swap / RAM
    warnings: tuple[str, ...]
    skipped: str | None  # why swapwise leaves the pod as it is
    backing: Backing
    overhead: Overhead = NO_OVERHEAD  # in before and after; no container's swap covers it

    @property
    def needed_swap_ratio(self) -> Fraction | None:
        """The smallest node swap/RAM ratio at which every cold memory fits."""
        ratios = [c.needed_swap_ratio for c in self.containers if c.needed_swap_ratio is not None]
        return max(ratios) if ratios else None

    @property
    def fits(self) -> bool | None:
        """All swap-using containers fit their share; None when no container uses swap."""
        verdicts = [c.fits for c in self.containers if c.fits is not None]
        return all(verdicts) if verdicts else None


def _bytes(value: Fraction | int | None) -> int | None:
    return None if value is None else math.ceil(value)


def _request(container: ContainerView, resource: str) -> Fraction:
    """The container's request; the API server copies a missing one from the limit."""
    return Fraction(container.requests.get(resource, container.limits.get(resource, 0)))


def pod_request(view: PodView, resource: str) -> Fraction:
    """What the scheduler reserves for the pod (``resource`` is ``cpu`` or ``memory``)."""
    pod_level = view.pod_level_resources()
    if pod_level is not None and resource in pod_level[0]:
        return Fraction(pod_level[0][resource])
    total = sum((_request(c, resource) for c in view.containers if c.kind == "container"),
                Fraction(0))
    sidecars = Fraction(0)
    init_peak = Fraction(0)
    for container in view.containers:
        request = _request(container, resource)
        if container.kind == "sidecar":  # keeps running: counts for the pod's whole life
            total += request
            sidecars += request
            init_peak = max(init_peak, sidecars)
        elif container.kind == "init":  # runs alone, next to the sidecars started before it
            init_peak = max(init_peak, request + sidecars)
    return max(total, init_peak)


def density(view: PodView, node: Node, overhead: Overhead = NO_OVERHEAD,
            unbacked: bool = False) -> Density:
    """Pods per node; the scheduler adds the pod overhead to the requests."""
    memory = math.ceil(pod_request(view, "memory")) + overhead.memory
    cpu = pod_request(view, "cpu") + overhead.cpu
    return Density(
        memory_request=memory,
        cpu_request=cpu,
        by_memory=node.schedulable_memory // memory if memory else None,
        by_cpu=math.floor(node.cpu / cpu) if cpu else None,
        by_pods=node.max_pods,
        overhead_memory=overhead.memory,
        overhead_cpu=overhead.cpu,
        unbacked=unbacked,
    )


def _backing(view: PodView, mutation: Mutation, profile: Profile, node: Node,
             daemonset: bool | None) -> Backing:
    """The pod's need on ``node``, and whether its placement will require backing: only
    where the webhook adds swap-node placement (the engine's own condition) to a pod it
    changes, and the profile requires backing."""
    need = backing.pod_need((change.request, change.limit) for change in mutation.changes)
    off = backing_off(profile)
    if mutation.skipped is not None:
        off = f"pod left unchanged: {mutation.skipped}"
    elif view.spec.get("nodeName"):
        off = "no swap-node placement: spec.nodeName is set"
    elif daemonset if daemonset is not None else view.owned_by_daemonset():
        off = "no swap-node placement: a DaemonSet's pod"
    elif not uses_swap(view, mutation.changes):
        off = "no swap-node placement: no container gets swap"
    elif not mutation.changes:  # the webhook requires backing for what it changes only
        off = "no container changed, nothing to back"
    return Backing(need, node.permille, off)


def _container_plan(
    before: ContainerView, after: ContainerView, eligible: bool, node: Node
) -> ContainerPlan:
    request = _bytes(after.memory_request)
    limit = _bytes(after.memory_limit)
    return ContainerPlan(
        name=after.name,
        kind=after.kind,
        request_before=_bytes(before.memory_request),
        limit_before=_bytes(before.memory_limit),
        request_after=request,
        limit_after=limit,
        swap_eligible=eligible,
        swap_share=node.swap_share(request) if eligible and request else 0,
        fit_request=node.fit_request(limit) if limit is not None else None,
    )


def plan_pod(
    reshaped: Reshape,
    node: Node,
    *,
    runtime_classes: Mapping[str, RuntimeClass] | None = None,
) -> PodPlan:
    """Measure a pod reshaped as the webhook would on ``node``, before and after.

    ``runtime_classes`` (by name) give the overhead of pods that name one in
    ``spec.runtimeClassName``. Raises :class:`~webhook.engine.pod.MalformedPod` when the
    pod cannot be read, :class:`~webhook.analysis.overhead.OverheadError` when the API server would
    reject its overhead.
    """
    before = PodView.parse(reshaped.pod)
    mutation, profile, daemonset = reshaped.mutation, reshaped.profile, reshaped.daemonset
    if mutation.skipped == "malformed":
        raise MalformedPod("; ".join(mutation.warnings))
    overhead, warnings = pod_overhead(before.spec, runtime_classes or {})
    after = PodView.parse(reshaped.after) if reshaped.changed else before
    containers = tuple(
        _container_plan(old, new, eligible, node)
        for old, new, eligible in zip(
            before.containers, after.containers, after.swap_eligible(), strict=True
        )
    )
    backed = _backing(before, mutation, profile, node, daemonset)
    return PodPlan(
        containers=containers,
        before=density(before, node, overhead),
        after=density(after, node, overhead, unbacked=backed.refused),
        swap_ratio=node.swap_ratio,
        warnings=(*mutation.warnings, *warnings),
        skipped=mutation.skipped,
        backing=backed,
        overhead=overhead,
    )
