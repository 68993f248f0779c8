"""Resources calculator: lower memory requests so the kubelet grants swap.

Only memory requests (and, with ``defaultLimit``, limits of containers that had
neither) are ever written; CPU and every other resource are left exactly as they came.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from webhook.base.quantity import MI, format_bytes
from webhook.engine.pod import ContainerView, Exact, PodView
from webhook.engine.pointer import PatchOp, add, set_member
from webhook.engine.warnings import (
    LIMIT_ADDED,
    LIMIT_NOT_ABOVE,
    LIMIT_RAISED,
    REQUEST_LOWERED,
    REQUEST_NOT_BELOW,
    warning,
)
from webhook.profile import Profile


@dataclass(frozen=True, init=False)
class ContainerChange:
    container: ContainerView
    request: int  # new memory request, bytes
    limit: int  # memory limit after the change, bytes
    limit_added: bool  # the limit came from defaultLimit
    original: dict[str, str]  # the memory request/limit as written, for the annotation
    # vpaPods: raiseLimit - the request (its VPA's) is kept and the limit raised instead
    limit_raised: bool = False

    def __init__(self, container: ContainerView, request: int, limit: int, limit_added: bool,
                 original: dict[str, str], limit_raised: bool = False) -> None:
        # Frozen, built with one dict update (see ContainerView).
        self.__dict__.update(container=container, request=request, limit=limit,
                             limit_added=limit_added, original=original,
                             limit_raised=limit_raised)


def target(limit: int, profile: Profile) -> int:
    """Request that lets the cold memory (limit - request) fit the container's swap share."""
    # ceilMi(limit * n/d) in integer arithmetic: exact, without building Fractions.
    numerator, denominator = profile.request_ratio_terms
    request = max(profile.min_request, -(-(limit * numerator) // (denominator * MI)) * MI)
    cap = profile.max_limit_request_ratio_terms
    if cap is not None:  # ceilMi(limit / (n/d)) = ceilMi(limit * d/n)
        request = max(request, -(-(limit * cap[1]) // (cap[0] * MI)) * MI)
    return request


def effective_max_ratio(profile: Profile) -> Fraction:
    """The largest memory limit/request a container reshaped by ``profile`` can have:
    :func:`target` keeps the request at least ``limit * requestRatio`` and at least
    ``limit / maxLimitRequestRatio``, and :func:`raised_limit` the limit at most the
    inverse of each (what a LimitRange's ``maxLimitRequestRatio`` must allow)."""
    ratio = 1 / profile.request_ratio
    cap = profile.max_limit_request_ratio
    return min(ratio, cap) if cap is not None else ratio


def raised_limit(request: int, profile: Profile) -> int:
    """The largest whole-MiB limit whose cold memory a container with ``request`` can swap.

    ``target`` the other way round: ``floorMi(request / requestRatio)``, and at most
    ``floorMi(request * maxLimitRequestRatio)``.
    """
    numerator, denominator = profile.request_ratio_terms
    limit = request * denominator // (numerator * MI) * MI
    cap = profile.max_limit_request_ratio_terms
    if cap is not None:
        limit = min(limit, request * cap[0] // (cap[1] * MI) * MI)
    return limit


def _cel_ceil_mi(x: str, ratio: Fraction) -> str:
    """ceilMi(x * ratio) in int64: x split by the divisor so no product overflows."""
    n, d = ratio.numerator, ratio.denominator * MI
    return f"((({x}) / {d}) * {n} + ((({x}) % {d}) * {n} + {d - 1}) / {d}) * {MI}"


def _cel_floor_mi(x: str, ratio: Fraction) -> str:
    """floorMi(x * ratio) in int64."""
    n, d = ratio.numerator, ratio.denominator * MI
    return f"((({x}) / {d}) * {n} + ((({x}) % {d}) * {n}) / {d}) * {MI}"


def cel_target(limit: str, profile: Profile) -> str:
    """CEL twin of :func:`target` for the int expression ``limit``; the profile's values
    are written in as constants."""
    terms = [str(profile.min_request), _cel_ceil_mi(limit, profile.request_ratio)]
    if profile.max_limit_request_ratio is not None:
        terms.append(_cel_ceil_mi(limit, 1 / profile.max_limit_request_ratio))
    return f"[{', '.join(terms)}].max()"


def cel_raised_limit(request: str, profile: Profile) -> str:
    """CEL twin of :func:`raised_limit` for the int expression ``request``."""
    terms = [_cel_floor_mi(request, 1 / profile.request_ratio)]
    if profile.max_limit_request_ratio is not None:
        terms.append(_cel_floor_mi(request, profile.max_limit_request_ratio))
    return f"[{', '.join(terms)}].min()" if len(terms) > 1 else terms[0]


def _ceil(value: Exact) -> int:
    """Whole bytes, rounded up (values are whole nearly always)."""
    return value if type(value) is int else -(-value.numerator // value.denominator)


def plan_container(
    container: ContainerView, profile: Profile, vpa_managed: bool = False
) -> ContainerChange | str | None:
    """The change for one container, a warning when it cannot be changed, or None.

    ``vpa_managed``: a VerticalPodAutoscaler sets this container's memory request (the
    profile says ``vpaPods: raiseLimit``): the request is kept, and when it equals the
    limit the limit is raised to :func:`raised_limit` instead.
    """
    limit = container.memory_limit
    request = container.memory_request
    if vpa_managed:
        if limit is None or request != limit:
            return None  # the VPA's request stands; request < limit is swap-eligible already
        request_bytes = _ceil(limit)
        new_limit = raised_limit(request_bytes, profile)
        if new_limit <= request_bytes:
            return warning(LIMIT_NOT_ABOVE.format(
                name=container.name, limit=format_bytes(new_limit),
                request=format_bytes(request_bytes)))
        return ContainerChange(container, request_bytes, new_limit, False, container.written,
                               limit_raised=True)
    if limit is not None:
        if request != limit:
            return None  # request < limit, or request only: already swap-eligible
        limit_bytes = _ceil(limit)
        limit_added = False
    elif request is None and profile.default_limit is not None:
        limit_bytes = profile.default_limit
        limit_added = True
    else:
        return None
    new_request = target(limit_bytes, profile)
    if new_request >= limit_bytes:
        return warning(REQUEST_NOT_BELOW.format(
            name=container.name, request=format_bytes(new_request),
            limit=format_bytes(limit_bytes)))
    return ContainerChange(container, new_request, limit_bytes, limit_added,
                           container.written)


def plan_resources(
    view: PodView, profile: Profile, vpa_managed: frozenset[str] = frozenset()
) -> tuple[list[ContainerChange], list[str]]:
    """``vpa_managed``: names of the (regular) containers whose memory a VPA sets."""
    changes: list[ContainerChange] = []
    warnings: list[str] = []
    for container in view.containers:
        managed = container.kind == "container" and container.name in vpa_managed
        result = plan_container(container, profile, managed)
        if result is None:
            continue
        if isinstance(result, str):
            warnings.append(result)
        else:
            changes.append(result)
            warnings.append(describe(result))
    return changes, warnings


def describe(change: ContainerChange) -> str:
    """One warning per changed container; quantities the user wrote are shown as written."""
    name, request = change.container.name, format_bytes(change.request)
    if change.limit_added:
        limit = format_bytes(change.limit)
        return warning(LIMIT_ADDED.format(name=name, limit=limit, request=request))
    limit, before = change.original["limit"], change.original["request"]
    if change.limit_raised:
        raised = format_bytes(change.limit)
        return warning(LIMIT_RAISED.format(name=name, limit=limit, raised=raised,
                                           request=before))
    return warning(REQUEST_LOWERED.format(name=name, before=before, request=request,
                                          limit=limit))


def resource_ops(change: ContainerChange) -> list[PatchOp]:
    """Patch operations for one container, creating missing objects on the way."""
    container = change.container
    path = container.path + "/resources"
    # PodView.parse has checked that these are objects (or absent).
    resources: dict[str, Any] = container.raw.get("resources") or {}
    if not change.limit_added and not change.limit_raised:  # nearly always: the request only
        requests = resources.get("requests")
        if requests:  # the loop below, for that one field: every admission's case, without
            # the loop's dict and iteration
            op = "add" if requests.get("memory") is None else "replace"
            return [{"op": op, "path": path + "/requests/memory",
                     "value": format_bytes(change.request)}]
        wanted = {"requests": format_bytes(change.request)}
    else:
        # raiseLimit keeps the request: written only when it was the limit's default (limit
        # only, as offline input can be; the API server has always filled it in before
        # webhooks run).
        explicit = container.requests.get("memory") is not None
        wanted = ({} if change.limit_raised and explicit
                  else {"requests": format_bytes(change.request)})
        wanted["limits"] = format_bytes(change.limit)
    if not resources:
        return [add(path, {field: {"memory": value} for field, value in wanted.items()})]
    ops: list[PatchOp] = []
    for field, value in wanted.items():  # "requests", "limits", "memory": nothing to escape
        existing = resources.get(field)
        if existing:
            op = "add" if existing.get("memory") is None else "replace"
            ops.append({"op": op, "path": f"{path}/{field}/memory", "value": value})
        else:
            ops.append(set_member(path, resources, field, {"memory": value}))
    return ops
