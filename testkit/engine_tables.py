"""What the engine's table tests share: a profile built from policy fields, and readers of
the pieces of a mutated pod they compare."""

from __future__ import annotations

from typing import Any

from webhook.policy import build_policy
from webhook.profile import Profile

SWAP = "swapwise.io/swap-node"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
SWAP_EXPR = {"key": SWAP, "operator": "In", "values": ["true"]}
PERMILLE = "swapwise.io/swap-permille"
PRESSURE = "swapwise.io/memory-pressure"
CPU_PRESSURE = "swapwise.io/cpu-pressure"
# Every required term of a pod with required placement: no pressure mark on the node
NO_PRESSURE = {"key": PRESSURE, "operator": "DoesNotExist"}
NO_CPU_PRESSURE = {"key": CPU_PRESSURE, "operator": "DoesNotExist"}
NO_MARKS = [NO_PRESSURE, NO_CPU_PRESSURE]


def backed(need: int) -> dict[str, Any]:
    """The swap-backing expression of a pod whose changed containers need ``need``‰."""
    return {"key": PERMILLE, "operator": "Gt", "values": [str(need - 1)]}


def backing_warning(need: int) -> str:
    return (f"swapwise: needs nodes whose swap is >= {need}\u2030 of their RAM "
            f"(node label {PERMILLE}, from the node agent)")


# A 2Gi Guaranteed container under DEFAULT: request 683Mi, 1000 x 1365 / 683 = 1998.5...
BACKED_2GI = backed(1999)


def profile(**fields: Any) -> Profile:
    policy = build_policy(
        {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy", "profiles": {"p": fields}}
    )
    found = policy.resolve("p")
    assert found is not None
    return found


DEFAULT = profile()


def memory(result: dict[str, Any], index: int = 0, field: str = "containers") -> dict[str, Any]:
    resources = result["spec"][field][index].get("resources", {})
    return {
        "request": resources.get("requests", {}).get("memory"),
        "limit": resources.get("limits", {}).get("memory"),
    }


def terms(result: dict[str, Any]) -> list[dict[str, Any]]:
    return result["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]

