"""The resolved form of a policy profile: what the mutation engine consumes.

The policy file (``policy.py``) is validated with pydantic; the engine never sees it.
It gets this frozen, exact-valued view instead, computed once per reload, so the hot
path does no parsing and no defaulting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

PlacementMode = Literal["required", "preferred", "none"]
GuaranteedPods = Literal["convert", "skip"]
VpaPods = Literal["skip", "raiseLimit"]
ResizePolicy = Literal["RestartContainer", "keep"]
SwapBacking = Literal["required", "off"]

SWAP_LABEL = "feature.node.kubernetes.io/memory-swap"


@dataclass(frozen=True)
class LabelSelector:
    """A metav1.LabelSelector; empty selects everything."""

    match_labels: tuple[tuple[str, str], ...] = ()
    # (key, operator, values)
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, labels: dict[str, Any]) -> bool:
        for key, value in self.match_labels:
            if labels.get(key) != value:
                return False
        for key, operator, values in self.match_expressions:
            present = key in labels
            if operator == "In":
                if not present or labels[key] not in values:
                    return False
            elif operator == "NotIn":
                if present and labels[key] in values:
                    return False
            elif operator == "Exists":
                if not present:
                    return False
            elif present:  # DoesNotExist
                return False
        return True


@dataclass(frozen=True)
class Placement:
    mode: PlacementMode = "required"
    node_selector: tuple[tuple[str, str], ...] = ((SWAP_LABEL, "true"),)
    weight: int = 100
    tolerations: tuple[dict[str, Any], ...] = ()
    # With mode "required": also require nodes whose swap share backs the pod's changed
    # containers (node label swapwise.io/swap-permille; docs/rules.md "Swap backing").
    swap_backing: SwapBacking = "required"


@dataclass(frozen=True)
class Profile:
    """Everything the engine needs to reshape one pod."""

    name: str
    request_ratio: Fraction = Fraction(1, 3)
    min_request: int = 16 * 1024 * 1024
    max_limit_request_ratio: Fraction | None = None
    default_limit: int | None = None
    guaranteed_pods: GuaranteedPods = "convert"
    vpa_pods: VpaPods = "raiseLimit"
    resize_policy: ResizePolicy = "RestartContainer"
    pod_selector: LabelSelector | None = None
    placement: Placement = field(default_factory=Placement)
    # The two ratios as (numerator, denominator) ints, for the engine's per-container
    # arithmetic: a Fraction's numerator and denominator are Python-level properties.
    request_ratio_terms: tuple[int, int] = field(init=False, repr=False, compare=False)
    max_limit_request_ratio_terms: tuple[int, int] | None = field(
        init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        cap = self.max_limit_request_ratio
        object.__setattr__(self, "request_ratio_terms", self.request_ratio.as_integer_ratio())
        object.__setattr__(self, "max_limit_request_ratio_terms",
                           None if cap is None else cap.as_integer_ratio())
