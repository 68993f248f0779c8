"""A read-only, validated view of the parts of a pod the engine reasons about.

The API server only sends well-formed pods, but ``preview`` reads user files and the
server must survive any input: every shape the engine touches is checked here once, and
anything unexpected raises :class:`MalformedPod` instead of producing a patch that
would not apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, Literal

from webhook.base.quantity import QuantityError, cel_positive, parse_quantity, parse_text

ContainerKind = Literal["init", "sidecar", "container"]
# Exact values; whole ones (nearly all) as int, which compares and adds in C, where a
# Fraction does it in Python code on every admission.
Exact = Fraction | int
Resources = dict[str, Exact]

CRITICAL_PRIORITY = 2_000_000_000
CRITICAL_CLASSES = frozenset({"system-cluster-critical", "system-node-critical"})
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
QOS_RESOURCES = ("cpu", "memory")
# Bounded work per admission: a 3 MiB review can hold ~40,000 containers or ~1,000,000
# tolerations. Real pods have a handful; beyond these the pod is left unchanged, with a
# warning, after reading only the lengths (docs/rules.md, "Limits").
MAX_CONTAINERS = 1000  # initContainers + containers
MAX_ITEMS = 1000  # any other list the engine walks (tolerations, affinity terms, ...)
SKIP_KEY = "swapwise.io/skip"
PROFILE_ANNOTATION = "swapwise.io/profile"
ORIGINAL_ANNOTATION = "swapwise.io/original"
OWN_ANNOTATIONS = frozenset({PROFILE_ANNOTATION, ORIGINAL_ANNOTATION})


class MalformedPod(ValueError):
    """The object does not have the shape of a core/v1 Pod where the engine needs it."""


class PodTooLarge(MalformedPod):
    """More containers (or list items) than swapwise reshapes: the pod is left alone."""


def as_dict(value: Any, where: str) -> dict[str, Any]:
    """``value`` as a mapping; absent (``None``) reads as empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedPod(f"{where} must be an object")
    return value


def as_list(value: Any, where: str, limit: int = MAX_ITEMS) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(f"{where} must be a list")
    if len(value) > limit:
        raise PodTooLarge(f"{where} has {len(value)} entries; swapwise reshapes at most {limit}")
    return value


def as_str(value: Any, where: str) -> str | None:
    """``value`` as a string; absent (``None``) reads as None."""
    if value is None or type(value) is str:
        return value
    raise MalformedPod(f"{where} must be a string")


def _at(field: str, index: int) -> str:
    return f"spec.{field}[{index}]"


def _exact_value(value: Fraction) -> Exact:
    return value.numerator if value.denominator == 1 else value


@lru_cache(maxsize=4096)
def _parse_text(value: str) -> Exact:
    """:func:`~webhook.base.quantity.parse_text`, whole values as int, cached here instead:
    ``__wrapped__`` bypasses parse_text's own cache, so a string is held once."""
    return _exact_value(parse_text.__wrapped__(value))


Parsed = tuple[Resources, Resources, dict[str, str]]  # requests, limits, memory as written

# A container's :data:`Parsed`, by the text of its cpu and memory entries. A cluster
# writes few distinct resource blocks, and every admission parses every container's: a
# hit is one lookup instead of four quantities. Shared by the containers that read the
# same text, so never mutated; emptied when full.
_RESOURCES: dict[tuple[Any, Any, Any, Any], Parsed] = {}
_RESOURCES_SIZE = 4096


def _written(resources: dict[str, Any]) -> dict[str, str]:
    """The memory request/limit as written; a missing request reads as the limit, as the
    API server defaults it, so ``preview`` records what the server would."""
    request = (resources.get("requests") or {}).get("memory")
    limit = (resources.get("limits") or {}).get("memory")
    if limit is None:
        return {} if request is None else {"request": str(request)}
    written = str(limit)
    return {"request": written if request is None else str(request), "limit": written}


def _resources(resources: dict[str, Any], where: tuple[str, int]) -> Parsed:
    """``resources.requests`` and ``resources.limits``, parsed (see :func:`_quantities`),
    and the memory entries as written (for the ``swapwise.io/original`` annotation)."""
    requests, limits = resources.get("requests"), resources.get("limits")
    key = None
    if type(requests) is dict and type(limits) is dict:  # else one is absent (or junk)
        key = (requests.get("cpu"), requests.get("memory"), limits.get("cpu"),
               limits.get("memory"))
        try:
            parsed = _RESOURCES.get(key)
        except TypeError:  # an unhashable quantity: junk, refused by _quantities
            parsed = None
        if parsed is not None:
            return parsed
    parsed = (_quantities(resources, "requests", where),
              _quantities(resources, "limits", where), _written(resources))
    # Only text is cached: 1, 1.0 and True would share a key.
    if key is not None and all(value is None or type(value) is str for value in key):
        if len(_RESOURCES) >= _RESOURCES_SIZE:
            _RESOURCES.clear()
        _RESOURCES[key] = parsed
    return parsed


_NO_RESOURCES: Parsed = ({}, {}, {})  # shared, like the cache's entries


def _parse_other(raw: Any) -> Exact:
    """A quantity that is not a string (a number, or junk): checked, then parsed."""
    return _exact_value(parse_quantity(raw))


def _quantities(resources: dict[str, Any], field: str, where: str | tuple[str, int]
                ) -> Resources:
    """The cpu/memory entries of ``resources[field]``, parsed exactly.

    ``where`` names ``resources`` in error messages: a path, or (list, index) of a
    container, formatted only when one is raised (this runs twice per container).
    """
    values = resources.get(field)
    if values is None:
        return {}
    if type(values) is not dict:
        values = as_dict(values, f"{_where(where)}.{field}")
    parsed: Resources = {}
    # Unrolled over QOS_RESOURCES: strings (nearly always) go straight to the cache.
    cpu, memory = values.get("cpu"), values.get("memory")
    try:
        if cpu is not None:
            parsed["cpu"] = _parse_text(cpu) if type(cpu) is str else _parse_other(cpu)
        if memory is not None:
            parsed["memory"] = (_parse_text(memory) if type(memory) is str
                                else _parse_other(memory))
    except QuantityError as exc:
        name = "memory" if "cpu" in parsed or cpu is None else "cpu"
        raise MalformedPod(f"{_where(where)}.{field}.{name}: {exc}") from exc
    return parsed


def _all_str(values: dict[str, Any]) -> bool:
    """Every value a string (one C-level pass; the error is found by a second, slow one)."""
    return not values or {*map(type, values.values())} == {str}


def _where(where: str | tuple[str, int]) -> str:
    return where if isinstance(where, str) else f"{_at(*where)}.resources"


@dataclass(frozen=True, init=False)
class ContainerView:
    """One container with its cpu/memory settings, as the API server sees them."""

    path: str  # JSON Pointer of the container, e.g. /spec/containers/0
    kind: ContainerKind
    name: str
    raw: dict[str, Any]
    requests: Resources
    limits: Resources
    # Effective request: the API server copies a missing request from the limit.
    memory_request: Exact | None
    memory_limit: Exact | None
    # The memory request and limit as written (strings); a missing request reads as the
    # limit. Shared between containers: never mutated.
    written: dict[str, str]

    def __init__(self, path: str, kind: ContainerKind, name: str, raw: dict[str, Any],
                 requests: Resources, limits: Resources, written: dict[str, str]) -> None:
        # Still frozen, but built with one dict update rather than the generated
        # __init__'s object.__setattr__ per field: one is built per container per admission.
        limit = limits.get("memory")
        self.__dict__.update(path=path, kind=kind, name=name, raw=raw, requests=requests,
                             limits=limits, memory_request=requests.get("memory", limit),
                             memory_limit=limit, written=written)


@dataclass(frozen=True, init=False)
class PodView:
    pod: dict[str, Any]
    metadata: dict[str, Any]
    spec: dict[str, Any]
    labels: dict[str, Any]
    annotations: dict[str, Any]
    containers: tuple[ContainerView, ...]  # initContainers first, then containers
    critical: bool  # see is_critical

    def __init__(self, pod: dict[str, Any], metadata: dict[str, Any], spec: dict[str, Any],
                 labels: dict[str, Any], annotations: dict[str, Any],
                 containers: tuple[ContainerView, ...], critical: bool) -> None:
        # Frozen, built with one dict update (see ContainerView): one per admission.
        self.__dict__.update(pod=pod, metadata=metadata, spec=spec, labels=labels,
                             annotations=annotations, containers=containers, critical=critical)

    @classmethod
    def parse(cls, pod: Any) -> PodView:
        if not isinstance(pod, dict):
            raise MalformedPod("pod must be an object")
        metadata = as_dict(pod.get("metadata"), "metadata")
        spec = as_dict(pod.get("spec"), "spec")
        init_containers = as_list(spec.get("initContainers"), "spec.initContainers",
                                  MAX_CONTAINERS)
        regular = as_list(spec.get("containers"), "spec.containers", MAX_CONTAINERS)
        total = len(init_containers) + len(regular)
        if total > MAX_CONTAINERS:
            raise PodTooLarge(f"pod has {total} containers; swapwise reshapes pods of at most "
                              f"{MAX_CONTAINERS}")
        labels = as_dict(metadata.get("labels"), "metadata.labels")
        if not _all_str(labels):
            for key, value in labels.items():
                if type(value) is not str:
                    raise MalformedPod(f"metadata.labels[{key!r}] must be a string")
        annotations = as_dict(metadata.get("annotations"), "metadata.annotations")
        if not _all_str(annotations):
            for key, value in annotations.items():
                if type(value) is not str and key not in OWN_ANNOTATIONS:
                    raise MalformedPod(f"metadata.annotations[{key!r}] must be a string")
        for field in ("priorityClassName", "nodeName", "restartPolicy"):
            value = spec.get(field)
            if value is not None and type(value) is not str:
                as_str(value, f"spec.{field}")  # raises, naming the field
        priority = spec.get("priority")
        if priority is not None and type(priority) is not int:  # (a bool is not either)
            raise MalformedPod("spec.priority must be an integer")
        # The kubelet never gives swap to critical pods; neither do we touch them.
        critical = (spec.get("priorityClassName") in CRITICAL_CLASSES
                    or (priority is not None and priority >= CRITICAL_PRIORITY)
                    or MIRROR_ANNOTATION in annotations)
        os_spec = spec.get("os")
        if os_spec is not None:
            as_str(as_dict(os_spec, "spec.os").get("name"), "spec.os.name")
        containers: list[ContainerView] = []
        append = containers.append
        for field, items in (("initContainers", init_containers), ("containers", regular)):
            init = field == "initContainers"
            for index, raw in enumerate(items):
                # Where, for error messages: built only when one is raised (this loop runs
                # for every container of every admission).
                container = raw if type(raw) is dict else as_dict(raw, _at(field, index))
                name = container.get("name")
                if type(name) is not str or not name:
                    raise MalformedPod(f"{_at(field, index)}.name must be a non-empty string")
                resources = container.get("resources")
                if type(resources) is not dict:
                    resources = as_dict(resources, f"{_at(field, index)}.resources")
                restart = container.get("restartPolicy")
                if restart is not None and type(restart) is not str:
                    as_str(restart, f"{_at(field, index)}.restartPolicy")
                kind: ContainerKind = "container"
                if init:
                    kind = "sidecar" if restart == "Always" else "init"
                requests, limits, written = _resources(resources, (field, index)) \
                    if resources else _NO_RESOURCES
                append(ContainerView(f"/spec/{field}/{index}", kind, name, container,
                                     requests, limits, written))
        return cls(pod, metadata, spec, labels, annotations, tuple(containers), critical)

    def is_critical(self) -> bool:
        """The kubelet never gives swap to critical pods; neither do we touch them."""
        return self.critical

    def owned_by_daemonset(self) -> bool:
        where = "metadata.ownerReferences"
        for ref in as_list(self.metadata.get("ownerReferences"), where):
            kind = ref.get("kind") if type(ref) is dict else as_dict(ref, f"{where}[]").get("kind")
            if kind == "DaemonSet":
                return True
            if kind is not None and type(kind) is not str:
                as_str(kind, f"{where}[].kind")  # raises
        return False

    def pod_level_resources(self) -> tuple[Resources, Resources] | None:
        """Pod-level ``spec.resources`` (cpu/memory), which decide QoS when present."""
        resources = as_dict(self.spec.get("resources"), "spec.resources")
        requests = _quantities(resources, "requests", "spec.resources")
        limits = _quantities(resources, "limits", "spec.resources")
        if not requests and not limits:
            return None
        return requests, limits

    def qos_class(self) -> str:
        """The pod's QoS class as the kubelet computes it."""
        units = [(c.requests, c.limits) for c in self.containers]
        return qos_class(units, self.pod_level_resources())

    def swap_eligible(self) -> tuple[bool, ...]:
        """Per container (in :attr:`containers` order): does the kubelet give it swap?"""
        qos, critical = self.qos_class(), self.is_critical()
        return tuple(
            gets_swap(qos, critical, c.memory_request, c.memory_limit) for c in self.containers
        )


def gets_swap(
    qos: str, critical: bool, request: Exact | None, limit: Exact | None
) -> bool:
    """The kubelet's LimitedSwap rule (docs/rules.md) for one container: does it get swap?

    The one home of the rule: the webhook's placement, ``preview`` and ``plan`` all ask it.
    ``qos`` is the pod's QoS class, ``critical`` whether the pod is critical, ``request``
    the container's effective memory request (a missing one copies the limit, as the API
    server defaults it) and ``limit`` its memory limit.

    The kubelet (``GetContainerSwapBehavior``, 1.34) swaps containers of Burstable,
    non-critical pods that have a memory request or limit, except when the request equals
    the limit. Its swap limit is ``request / memory capacity * swap capacity``, so a
    request of 0 gets ``memory.swap.max`` 0: no swap, and this rule says so.
    """
    if critical or qos != "Burstable" or request is None:
        return False
    return request > 0 and request != limit


def qos_class(
    units: list[tuple[Resources, Resources]],
    pod_level: tuple[Resources, Resources] | None = None,
) -> str:
    """The pod QoS class, computed as the kubelet does (``ComputePodQOS``).

    Each unit is one container's (requests, limits) for cpu/memory; pod-level resources,
    when set, replace them. Missing requests are taken from limits: the API server
    defaults them before any webhook runs, and ``preview`` must reason about that pod.
    """
    # Sums are exact either way; values are summed as ints in nano-units when whole (nearly
    # always), because Fraction arithmetic dominated the cost of an admission.
    requests: dict[str, Fraction | int] = {}
    limits: dict[str, Fraction | int] = {}
    guaranteed = True
    for unit_requests, unit_limits in [pod_level] if pod_level is not None else units:
        # A missing request counts as its limit; a Fraction's denominator is positive.
        positive_limits = 0
        for name, value in unit_limits.items():
            if value.numerator > 0:
                scaled = _exact(value)
                limits[name] = limits.get(name, 0) + scaled
                if name in QOS_RESOURCES:
                    positive_limits += 1
                if name not in unit_requests:
                    requests[name] = requests.get(name, 0) + scaled
        for name, value in unit_requests.items():
            if value.numerator > 0:
                requests[name] = requests.get(name, 0) + _exact(value)
        if positive_limits < len(QOS_RESOURCES):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    same = all(limits.get(name) == value for name, value in requests.items())
    if guaranteed and len(requests) == len(limits) and same:
        return "Guaranteed"
    return "Burstable"


# qos_class's CEL twin, for the rendered admission policies (webhook/render), on the pod as
# admission receives it: a valid pod, every request at most its limit, so the kubelet's sums
# equal per-container equality.
_CEL_QOS_RESOURCES = "[" + ", ".join(f"'{name}'" for name in QOS_RESOURCES) + "]"


def _cel_guaranteed(requests: str, limits: str) -> str:
    """QoS Guaranteed for one (requests, limits) pair of CEL resource maps."""
    return (f"{_CEL_QOS_RESOURCES}.all(k, k in {limits} && "
            f"{cel_positive(f'string({limits}[k])')} && "
            f"(!(k in {requests}) || quantity(string({requests}[k])) == "
            f"quantity(string({limits}[k]))))")


_CEL_POD_REQUESTS = "object.spec.?resources.?requests.orValue({})"
_CEL_POD_LIMITS = "object.spec.?resources.?limits.orValue({})"
# Pod-level resources decide QoS when set (pod_level_resources).
CEL_POD_LEVEL = (f"{_CEL_QOS_RESOURCES}.exists(k, k in {_CEL_POD_REQUESTS} || "
                 f"k in {_CEL_POD_LIMITS})")
CEL_POD_GUARANTEED = _cel_guaranteed(_CEL_POD_REQUESTS, _CEL_POD_LIMITS)
CEL_POD_BEST_EFFORT = (f"!{_CEL_QOS_RESOURCES}.exists(k, (k in {_CEL_POD_REQUESTS} && "
                       f"{cel_positive(f'string({_CEL_POD_REQUESTS}[k])')}) || "
                       f"(k in {_CEL_POD_LIMITS} && "
                       f"{cel_positive(f'string({_CEL_POD_LIMITS}[k])')}))")
CEL_CONTAINERS_GUARANTEED = (
    "(object.spec.?initContainers.orValue([]) + object.spec.containers).all(c, "
    + _cel_guaranteed("c.?resources.?requests.orValue({})", "c.?resources.?limits.orValue({})")
    + ")"
)


NANO = 10**9  # the finest quantity suffix is n: nearly every value is whole in nano-units


def _exact(value: Exact) -> Exact:
    """``value`` * 10**9, as an int when that is whole (cheaper to add and compare).

    Every sum and comparison in :func:`qos_class` is scaled alike, so results are exact.
    """
    scaled = value.numerator * NANO
    denominator = value.denominator
    if denominator == 1:
        return scaled
    if scaled % denominator == 0:
        return scaled // denominator
    return Fraction(scaled, denominator)
