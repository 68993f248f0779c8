"""Resources calculator: lower memory requests so the kubelet grants swap.

Only memory requests (and, with ``defaultLimit``, limits of containers that had
neither) are ever written; CPU and every other resource are left exactly as they came.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webhook.engine.pod import ContainerView, PodView, as_dict
from webhook.engine.pointer import PatchOp, add, set_member
from webhook.engine.warnings import warning
from webhook.profile import Profile
from webhook.quantity import MI, format_bytes


@dataclass(frozen=True)
class ContainerChange:
    container: ContainerView
    request: int  # new memory request, bytes
    limit: int  # memory limit after the change, bytes
    limit_added: bool  # the limit came from defaultLimit
    original: dict[str, str]  # the memory request/limit as written, for the annotation


def target(limit: int, profile: Profile) -> int:
    """Request that lets the cold memory (limit - request) fit the container's swap share."""
    # ceilMi(limit * n/d) in integer arithmetic: exact, without building Fractions.
    ratio = profile.request_ratio
    request = max(profile.min_request,
                  -(-(limit * ratio.numerator) // (ratio.denominator * MI)) * MI)
    cap = profile.max_limit_request_ratio
    if cap is not None:  # ceilMi(limit / (n/d)) = ceilMi(limit * d/n)
        request = max(request, -(-(limit * cap.denominator) // (cap.numerator * MI)) * MI)
    return request


def _written(container: ContainerView) -> dict[str, str]:
    """The memory request/limit as written; a missing request reads as the limit, as the
    API server defaults it, so ``preview`` records what the server would."""
    resources = as_dict(container.raw.get("resources"), container.name)
    original: dict[str, str] = {}
    for key, field in (("request", "requests"), ("limit", "limits")):
        value = as_dict(resources.get(field), field).get("memory")
        if value is not None:
            original[key] = str(value)
    if "limit" in original:
        original = {"request": original.get("request", original["limit"]), **original}
    return original


def plan_container(container: ContainerView, profile: Profile) -> ContainerChange | str | None:
    """The change for one container, a warning when it cannot be changed, or None."""
    limit = container.memory_limit
    request = container.memory_request
    if limit is not None:
        if request != limit:
            return None  # request < limit, or request only: already swap-eligible
        limit_bytes = -(-limit.numerator // limit.denominator)
        limit_added = False
    elif request is None and profile.default_limit is not None:
        limit_bytes = profile.default_limit
        limit_added = True
    else:
        return None
    new_request = target(limit_bytes, profile)
    if new_request >= limit_bytes:
        return warning(
            f"{container.name} memory left unchanged: request {format_bytes(new_request)} "
            f"would not be below limit {format_bytes(limit_bytes)}"
        )
    return ContainerChange(container, new_request, limit_bytes, limit_added, _written(container))


def plan_resources(view: PodView, profile: Profile) -> tuple[list[ContainerChange], list[str]]:
    changes: list[ContainerChange] = []
    warnings: list[str] = []
    for container in view.containers:
        result = plan_container(container, profile)
        if isinstance(result, ContainerChange):
            changes.append(result)
            warnings.append(describe(result))
        elif isinstance(result, str):
            warnings.append(result)
    return changes, warnings


def describe(change: ContainerChange) -> str:
    """One warning per changed container; quantities the user wrote are shown as written."""
    name, request = change.container.name, format_bytes(change.request)
    if change.limit_added:
        limit = format_bytes(change.limit)
        return warning(f"{name} memory limit {limit} (defaultLimit), request {request}")
    limit, before = change.original["limit"], change.original["request"]
    return warning(f"{name} memory request {before} -> {request} (limit {limit})")


def resource_ops(change: ContainerChange) -> list[PatchOp]:
    """Patch operations for one container, creating missing objects on the way."""
    path = f"{change.container.path}/resources"
    resources: dict[str, Any] = as_dict(change.container.raw.get("resources"), path)
    wanted = {"requests": format_bytes(change.request)}
    if change.limit_added:
        wanted["limits"] = format_bytes(change.limit)
    if not resources:
        return [add(path, {field: {"memory": value} for field, value in wanted.items()})]
    ops: list[PatchOp] = []
    for field, value in wanted.items():
        existing = as_dict(resources.get(field), field)
        if existing:
            ops.append(set_member(f"{path}/{field}", existing, "memory", value))
        else:
            ops.append(set_member(path, resources, field, {"memory": value}))
    return ops
