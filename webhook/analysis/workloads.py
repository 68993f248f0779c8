"""Find the pod (template) inside Kubernetes objects, for ``preview`` and ``plan``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Where each supported kind keeps the pod it creates.
POD_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


@dataclass(frozen=True)
class Workload:
    """One object that creates pods, and the pod-shaped dict inside it."""

    obj: dict[str, Any]
    path: tuple[str, ...]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))

    @property
    def name(self) -> str:
        metadata = self.obj.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        return str(name) if name else "<unnamed>"

    @property
    def namespace(self) -> str | None:
        metadata = self.obj.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
        return namespace if isinstance(namespace, str) else None

    @property
    def daemonset(self) -> bool:
        """DaemonSet pods are pinned to their node: they get no placement."""
        return self.kind == "DaemonSet"

    @property
    def replicas(self) -> int:
        spec = self.obj.get("spec")
        if self.kind in ("Deployment", "StatefulSet", "ReplicaSet") and isinstance(spec, dict):
            replicas = spec.get("replicas", 1)
            return replicas if isinstance(replicas, int) else 1
        return 1

    def pod(self) -> dict[str, Any] | None:
        node: Any = self.obj
        for key in self.path:
            node = node.get(key) if isinstance(node, dict) else None
        return node if isinstance(node, dict) else None

    def with_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        """A copy of the object with its pod (template) replaced."""
        if not self.path:
            return pod
        result = dict(self.obj)
        node = result
        for key in self.path[:-1]:
            node[key] = dict(node[key])
            node = node[key]
        node[self.path[-1]] = pod
        return result

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"


def find_workload(obj: Any) -> Workload | None:
    if not isinstance(obj, dict):
        return None
    path = POD_PATHS.get(str(obj.get("kind")))
    if path is None:
        return None
    workload = Workload(obj, path)
    return workload if workload.pod() is not None else None


def iter_objects(documents: list[Any]) -> Iterator[Any]:
    """Documents with ``kind: List`` flattened into their items."""
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == "List":
            items = document.get("items")
            yield from iter_objects(items if isinstance(items, list) else [])
        elif document is not None:
            yield document
