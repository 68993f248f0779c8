"""Pod overhead for ``swapwise plan``: what a RuntimeClass adds to every pod that uses it.

A RuntimeClass may declare ``overhead.podFixed`` (the sandbox's own cost: gVisor's Sentry,
a Kata VM's guest kernel and agent). The API server's RuntimeClass admission plugin copies
it into ``pod.spec.overhead`` when the pod is created, before any mutating webhook runs, and
rejects a pod whose ``spec.overhead`` differs from it, or that sets one while its
RuntimeClass declares none. The scheduler adds it to the pod's requests; no container's
swap share covers it (the kubelet's swap limits are per container).

Pure: parsed documents in, numbers out. Quantities are read exactly, like the engine's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from webhook.base.quantity import QuantityError, parse_quantity


class OverheadError(ValueError):
    """A RuntimeClass that cannot be read, or a pod the API server would reject."""


@dataclass(frozen=True)
class Overhead:
    """The overhead the scheduler adds to one pod's requests, and where it came from."""

    memory: int = 0  # bytes
    cpu: Fraction = Fraction(0)  # cores
    source: str | None = None  # "RuntimeClass/gvisor", "spec.overhead", or None: no overhead

    def __bool__(self) -> bool:
        return bool(self.memory or self.cpu)


NO_OVERHEAD = Overhead()

ResourceList = dict[str, Fraction]


@dataclass(frozen=True)
class RuntimeClass:
    name: str
    pod_fixed: ResourceList | None  # None: the RuntimeClass declares no overhead


def _resource_list(value: Any, where: str) -> ResourceList:
    if not isinstance(value, dict):
        raise OverheadError(f"{where} must be a mapping of resource names to quantities")
    parsed: ResourceList = {}
    for name, raw in value.items():
        try:
            quantity = parse_quantity(raw)
        except QuantityError as exc:
            raise OverheadError(f"{where}.{name}: {exc}") from None
        if quantity < 0:
            raise OverheadError(f"{where}.{name}: must not be negative")
        parsed[str(name)] = quantity
    return parsed


def is_runtime_class(obj: Any) -> bool:
    return isinstance(obj, dict) and obj.get("kind") == "RuntimeClass"


def parse_runtime_class(obj: dict[str, Any]) -> RuntimeClass:
    """A ``node.k8s.io/v1`` RuntimeClass document (``overhead.podFixed`` at the top level)."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str) or not name:
        raise OverheadError("RuntimeClass without metadata.name")
    where = f"RuntimeClass/{name}"
    if isinstance(obj.get("spec"), dict):
        raise OverheadError(f"{where}: spec is node.k8s.io/v1alpha1; use node.k8s.io/v1")
    overhead = obj.get("overhead")
    if overhead is None:
        return RuntimeClass(name, None)
    if not isinstance(overhead, dict):
        raise OverheadError(f"{where}: overhead must be a mapping")
    pod_fixed = overhead.get("podFixed")
    if pod_fixed is None:
        return RuntimeClass(name, None)
    return RuntimeClass(name, _resource_list(pod_fixed, f"{where}: overhead.podFixed"))


def collect_runtime_classes(objects: Iterable[Any]) -> dict[str, RuntimeClass]:
    """The RuntimeClasses among ``objects``, by name; one name defined twice differently
    is an error (the cluster can hold only one)."""
    found: dict[str, RuntimeClass] = {}
    for obj in objects:
        if not is_runtime_class(obj):
            continue
        runtime_class = parse_runtime_class(obj)
        known = found.get(runtime_class.name)
        if known is not None and known != runtime_class:
            raise OverheadError(
                f"RuntimeClass/{runtime_class.name} is defined twice, with different overheads"
            )
        found[runtime_class.name] = runtime_class
    return found


def _overhead(resources: ResourceList, source: str) -> Overhead:
    return Overhead(
        memory=math.ceil(resources.get("memory", Fraction(0))),
        cpu=resources.get("cpu", Fraction(0)),
        source=source,
    )


def pod_overhead(
    spec: Mapping[str, Any], runtime_classes: Mapping[str, RuntimeClass]
) -> tuple[Overhead, list[str]]:
    """The overhead of the pod with this ``spec`` once created, and warnings.

    As the RuntimeClass admission plugin decides it: the RuntimeClass named by
    ``runtimeClassName`` wins; ``spec.overhead`` must then equal its ``podFixed``. When that
    RuntimeClass is not among ``runtime_classes``, ``spec.overhead`` is taken as written
    (a pod read back from a cluster carries it), and without it the plan warns.
    """
    name = spec.get("runtimeClassName")
    written = spec.get("overhead")
    declared = _resource_list(written, "spec.overhead") if written is not None else None
    if name is None:
        if declared is not None:
            raise OverheadError("spec.overhead is set without a runtimeClassName: the API "
                                "server rejects this pod")
        return NO_OVERHEAD, []
    if not isinstance(name, str) or not name:
        raise OverheadError("spec.runtimeClassName must be a non-empty string")
    runtime_class = runtime_classes.get(name)
    if runtime_class is None:
        if declared is not None:
            return _overhead(declared, "spec.overhead"), []
        return NO_OVERHEAD, [
            f"RuntimeClass {name!r} is not in the input or --runtime-class-file: "
            "planned without its pod overhead"
        ]
    source = f"RuntimeClass/{name}"
    if runtime_class.pod_fixed is None:
        if declared is not None:
            raise OverheadError(f"spec.overhead is set but {source} declares no overhead: "
                                "the API server rejects this pod")
        return Overhead(source=source), []
    if declared is not None and declared != runtime_class.pod_fixed:
        raise OverheadError(f"spec.overhead differs from {source}'s overhead.podFixed: the "
                            "API server rejects this pod")
    return _overhead(runtime_class.pod_fixed, source), []
