"""Builders for pods and AdmissionReviews used across the tests."""

from __future__ import annotations

import copy
import uuid
from typing import Any


def container(
    name: str = "app",
    request: str | None = None,
    limit: str | None = None,
    cpu: str | None = "100m",
    **extra: Any,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if request is not None or cpu is not None:
        resources["requests"] = {}
    if request is not None:
        resources["requests"]["memory"] = request
    if cpu is not None:
        resources["requests"]["cpu"] = cpu
    if limit is not None:
        resources["limits"] = {"memory": limit}
        if cpu is not None:
            resources["limits"]["cpu"] = cpu
    result: dict[str, Any] = {"name": name, "image": "registry.example/app:1"}
    if resources:
        result["resources"] = resources
    result.update(extra)
    return result


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns"}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    body: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init is not None:
        body["initContainers"] = init
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def guaranteed(memory: str = "2Gi", cpu: str = "500m", name: str = "app") -> dict[str, Any]:
    return container(name, request=memory, limit=memory, cpu=cpu)


def review(
    obj: dict[str, Any] | None,
    operation: str = "CREATE",
    kind: str = "Pod",
    namespace: str = "ns",
    sub_resource: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "requestKind": {"group": "", "version": "v1", "kind": kind},
        "requestResource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
        "name": "p",
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "system:serviceaccount:ns:default"},
        "object": copy.deepcopy(obj),
        "oldObject": None,
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
