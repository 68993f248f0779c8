"""Swap backing: the arithmetic that says whether a node's swap covers a container.

The kubelet (LimitedSwap) grants a container ``swap.max = request x swap capacity ÷ memory
capacity``. A container is *backed* on a node when that share is at least ``limit -
request``: everything above its request can then go to swap, and the node's RAM only has
to hold the requests the scheduler already counts.

Both sides are whole numbers in per-mille, so the scheduler can compare them with a plain
``Gt`` node-affinity expression: the node's share is ``floor(1000 x swap ÷ memory)`` (the
``swapwise.io/swap-permille`` label the node agent writes, with the node's backing swap),
a container's need is
``ceil(1000 x (limit - request) ÷ request)``. Rounding each the safe way keeps the test
sound: ``permille ≥ need`` implies the exact inequality.

One home for the label's name and both roundings: the engine, the node agent, ``plan``,
``audit`` and the rendered admission policies all read them from here (the need's CEL form,
:func:`cel_container_need`, beside its Python one).
"""

from __future__ import annotations

from collections.abc import Iterable

PERMILLE_LABEL = "swapwise.io/swap-permille"


def node_permille(swap_bytes: int, memory_bytes: int) -> int:
    """The label value of a node: floor(1000 x swap capacity ÷ memory capacity); 0 when
    either is not positive."""
    if swap_bytes <= 0 or memory_bytes <= 0:
        return 0
    return 1000 * swap_bytes // memory_bytes


def container_need(request: int, limit: int) -> int:
    """ceil(1000 x (limit - request) ÷ request): the per-mille of its request a container
    needs as swap so that all of its memory above the request fits there (0 when the limit
    is not above the request)."""
    if request <= 0:
        raise ValueError("a container's need is defined for a positive request only")
    excess = limit - request
    return -(-1000 * excess // request) if excess > 0 else 0


def cel_container_need(request: str, limit: str) -> str:
    """CEL twin of :func:`container_need` for the int expressions ``request`` (r > 0) and
    ``limit`` (lim > r), exact for every pair of int64s.

    ceil(1000 * (lim - r) / r) with e = lim - r = a*r + b is 1000*a + k, k = ceil(1000*b / r)
    in [0, 1000]. 1000*b overflows int64 once r passes 8 PiB, so k is not computed by
    division: it is the first of a few candidates around a double estimate (off by less than
    one) for which k*r >= 1000*b, tested as ``b - k*(r/1000) <= k*(r%1000)/1000`` where no
    product exceeds r; 1000 always passes. 1000*a cannot overflow for a renderable profile
    (a < 1/requestRatio < 2^42). ``[v].map(x, ...)[0]`` binds a value (CEL has no let).
    """
    test = "b - k * (x[0] / 1000) <= k * (x[0] % 1000) / 1000"
    k = (f"[int(1000.0 * double(b) / double(x[0]))].map(y, ([y - 1, y, y + 1, y + 2]"
         f".filter(k, k >= 1 && k <= 1000 && {test}) + [1000])[0])[0]")
    return (f"[[{request}, {limit} - {request}]].map(x, 1000 * (x[1] / x[0]) + "
            f"[x[1] % x[0]].map(b, b == 0 ? 0 : {k})[0])[0]")


def pod_need(pairs: Iterable[tuple[int, int]]) -> int:
    """The largest need over (request, limit) pairs; 0 for none."""
    return max((container_need(request, limit) for request, limit in pairs), default=0)


def backed(need: int, permille: int) -> bool:
    """Does a node whose label says ``permille`` back a container (or pod) of ``need``?"""
    return permille >= need


def swap_share(request: int, swap_bytes: int, memory_bytes: int) -> int:
    """The kubelet's swap limit for a container with ``request`` (bytes, before the kernel
    rounds it down to a page)."""
    if memory_bytes <= 0:
        return 0
    return request * swap_bytes // memory_bytes
