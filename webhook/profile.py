"""The resolved form of a policy profile: what the mutation engine consumes.

The policy file (``policy.py``) is validated with pydantic; the engine never sees it.
It gets this frozen, exact-valued view instead, computed once per reload, so the hot
path does no parsing and no defaulting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

from webhook.base.cel import cel_literal, cel_string
from webhook.base.quantity import parse_bytes

PlacementMode = Literal["required", "preferred", "none"]
GuaranteedPods = Literal["convert", "skip"]
VpaPods = Literal["skip", "raiseLimit"]
ResizePolicy = Literal["RestartContainer", "keep"]
SwapBacking = Literal["required", "off"]

# The swap-node label swapwise's node agent writes: the kubelet runs LimitedSwap and the node
# has swap (how much of it backs pods is the swapwise.io/swap-permille label). Not Node
# Feature Discovery's feature.node.kubernetes.io/memory-swap: NFD owns that key with another
# meaning (swap present, whatever the kubelet does with it), and two writers of one key
# rewrite each other's value.
SWAP_LABEL = "swapwise.io/swap-node"

# Every profile default, once: the policy file's schema (policy.py) and the resolved
# profile below both take them from here, as do the docs' tests.
DEFAULT_SWAP_RATIO = 2
DEFAULT_REQUEST_RATIO = Fraction(1, 1 + DEFAULT_SWAP_RATIO)
DEFAULT_MIN_REQUEST = "16Mi"
DEFAULT_GUARANTEED_PODS: GuaranteedPods = "convert"
DEFAULT_VPA_PODS: VpaPods = "raiseLimit"
DEFAULT_RESIZE_POLICY: ResizePolicy = "RestartContainer"
DEFAULT_PLACEMENT_MODE: PlacementMode = "required"
DEFAULT_NODE_SELECTOR: tuple[tuple[str, str], ...] = ((SWAP_LABEL, "true"),)
DEFAULT_WEIGHT = 100
DEFAULT_SWAP_BACKING: SwapBacking = "required"


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

    def cel_matches(self, labels: str) -> str:
        """CEL twin of :meth:`matches` for the CEL map expression ``labels``."""
        parts = [f"({cel_string(k)} in {labels} && {labels}[{cel_string(k)}] == "
                 f"{cel_string(v)})" for k, v in self.match_labels]
        for key, operator, values in self.match_expressions:
            present = f"{cel_string(key)} in {labels}"
            inside = f"{labels}[{cel_string(key)}] in {cel_literal(list(values))}"
            parts.append({
                "In": f"({present} && {inside})",
                "NotIn": f"(!({present}) || !({inside}))",
                "Exists": f"({present})",
            }.get(operator, f"!({present})"))  # DoesNotExist
        return " && ".join(parts) or "true"


@dataclass(frozen=True)
class Placement:
    mode: PlacementMode = DEFAULT_PLACEMENT_MODE
    node_selector: tuple[tuple[str, str], ...] = DEFAULT_NODE_SELECTOR
    weight: int = DEFAULT_WEIGHT
    tolerations: tuple[dict[str, Any], ...] = ()
    # With mode "required": also require nodes whose swap share backs the pod's changed
    # containers (node label swapwise.io/swap-permille; docs/rules.md "Swap backing").
    swap_backing: SwapBacking = DEFAULT_SWAP_BACKING


@dataclass(frozen=True)
class Profile:
    """Everything the engine needs to reshape one pod."""

    name: str
    request_ratio: Fraction = DEFAULT_REQUEST_RATIO
    min_request: int = parse_bytes(DEFAULT_MIN_REQUEST)
    max_limit_request_ratio: Fraction | None = None
    default_limit: int | None = None
    guaranteed_pods: GuaranteedPods = DEFAULT_GUARANTEED_PODS
    vpa_pods: VpaPods = DEFAULT_VPA_PODS
    resize_policy: ResizePolicy = DEFAULT_RESIZE_POLICY
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
