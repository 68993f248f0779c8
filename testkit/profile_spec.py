"""A compiled Profile written back as policy-file fields, so a profile that a test built
(or hypothesis drew) can be served by ``swapwise serve --policy`` too."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction
from typing import Any

from webhook.base.quantity import format_bytes
from webhook.policy import ProfileSpec, compile_profile
from webhook.profile import Profile


def _decimal(value: Fraction) -> float | int | None:
    """``value`` as the number a policy file would hold, when it has a finite decimal form."""
    if value.denominator == 1:
        return int(value)
    d = value.denominator
    while d % 2 == 0:
        d //= 2
    while d % 5 == 0:
        d //= 5
    if d != 1:
        return None
    number = float(Decimal(value.numerator) / Decimal(value.denominator))
    return number if Fraction(Decimal(repr(number))) == value else None


def profile_fields(profile: Profile) -> dict[str, Any]:
    """Policy-file fields that compile back to ``profile`` (checked)."""
    fields: dict[str, Any] = {}
    swap = _decimal(1 / profile.request_ratio - 1)
    if swap is not None:
        fields["swapRatio"] = swap
    else:
        ratio = _decimal(profile.request_ratio)
        if ratio is None:
            raise ValueError(f"request ratio {profile.request_ratio} has no decimal form")
        fields["requestRatio"] = ratio
    fields["minRequest"] = format_bytes(profile.min_request)
    if profile.max_limit_request_ratio is not None:
        fields["maxLimitRequestRatio"] = _decimal(profile.max_limit_request_ratio)
    if profile.default_limit is not None:
        fields["defaultLimit"] = format_bytes(profile.default_limit)
    fields["guaranteedPods"] = profile.guaranteed_pods
    fields["vpaPods"] = profile.vpa_pods
    fields["resizePolicy"] = profile.resize_policy
    if profile.pod_selector is not None:
        fields["podSelector"] = {
            "matchLabels": dict(profile.pod_selector.match_labels),
            "matchExpressions": [
                {"key": k, "operator": o, "values": list(v)}
                for k, o, v in profile.pod_selector.match_expressions
            ],
        }
    placement = profile.placement
    fields["placement"] = {
        "mode": placement.mode,
        "nodeSelector": dict(placement.node_selector),
        "weight": placement.weight,
        "tolerations": [dict(t) for t in placement.tolerations],
        "swapBacking": placement.swap_backing,
    }
    back = compile_profile(profile.name, ProfileSpec.model_validate(fields))
    if back != profile:
        raise ValueError(f"profile {profile.name} does not round-trip: {back} != {profile}")
    return fields
