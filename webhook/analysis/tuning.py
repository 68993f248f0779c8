"""``swapwise tune``'s decision: what each profile's pods did in, a ratio per profile out.

Pure (no I/O, no clock): :func:`recommend` takes the containers :mod:`webhook.analysis.usage`
read from Prometheus and the policy, and returns one :class:`Recommendation` per profile.

Why these signals: a reshaped container runs as fast as before while its hot memory stays
under its request, because swap then holds only pages it does not touch. Two figures tell
whether it does, both per container over the window:

- the working set (what the container keeps resident) against its request. On a full swap
  node the kernel reclaims every container toward its share, so a working set well under
  the request means the hot set is under it too;
- memory pressure (PSI ``some``: the share of time a task of the container waited for
  memory). Hot pages that do not fit are swapped out and back in, and that is waiting.

The rules, per profile (shares are the 95th percentile over its containers, so a few odd
pods neither trigger nor hide a change):

- ``lower`` swapRatio (a larger request) when the containers stall (``STALLING``) while
  their working set presses on the request (``PRESSED``). Under pressure the working set
  shows what a container could keep, not what it needed, so the new request is the working
  set plus ``HEADROOM`` plus the stall share again.
- ``raise`` swapRatio when they never stall (``CALM``), their working set stays under
  ``ROOMY`` of the request and seldom (``SELDOM``) crosses it: the request goes down to the
  working set plus ``HEADROOM``. A change under ``SMALL_CHANGE`` is a ``keep``.
- ``keep`` otherwise; ``insufficient-data`` with fewer pods or samples than asked for, or
  without the pressure figures: then nothing is recommended.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Literal

from webhook.analysis.usage import ContainerUsage
from webhook.policy import Policy
from webhook.profile import DEFAULT_REQUEST_RATIO

Action = Literal["keep", "raise", "lower", "insufficient-data"]
Knob = Literal["swapRatio", "requestRatio"]

STALLING = 0.10  # waited for memory 10 % of the window or more
CALM = 0.02  # under 2 % of the window
CALM_PEAK = 0.10  # and no stretch (a rate interval) above 10 %
PRESSED = 0.9  # working set at 90 % of the request or more
ROOMY = 0.8  # working set under 80 % of the request
SELDOM = 0.05  # above the request at most 5 % of the window
HEADROOM = 0.25
SMALL_CHANGE = 0.10
MAX_REQUEST_RATIO = Fraction(9, 10)  # beyond this, reshaping gains too little to recommend it
DEFAULT_MIN_PODS = 3
DEFAULT_MIN_SAMPLES = 10


@dataclass(frozen=True)
class Evidence:
    """What a recommendation rests on; shares of time 0-1, ratios of the request."""

    pods: int = 0
    containers: int = 0
    in_overridden_namespaces: int = 0  # pods left out: their namespace overrides the profile
    samples_median: float = 0
    working_set_over_request_p50: float | None = None
    working_set_over_request_p95: float | None = None
    working_set_over_request_max: float | None = None
    above_request_share: float | None = None  # mean over the containers
    containers_above_request: int = 0  # containers whose working set ever crossed it
    stall_share_p50: float | None = None
    stall_share_p95: float | None = None
    stall_peak_p95: float | None = None
    swap_max_bytes: float | None = None
    observed_request_ratio: float | None = None  # median request / limit
    containers_left_out: int = 0  # of reshaped pods, with figures no memory can have

    def as_dict(self) -> dict[str, Any]:
        return {name: (round(value, 4) if isinstance(value, float) else value)
                for name, value in self.__dict__.items()}


@dataclass(frozen=True)
class Recommendation:
    profile: str
    action: Action
    knob: Knob  # the one the policy gives the profile with (swapRatio when neither)
    request_ratio: Fraction  # the profile's, now
    recommended_request_ratio: Fraction | None = None
    reasons: tuple[str, ...] = ()
    evidence: Evidence = field(default_factory=Evidence)

    @property
    def swap_ratio(self) -> float:
        return swap_ratio_of(self.request_ratio)

    @property
    def recommended_swap_ratio(self) -> float | None:
        ratio = self.recommended_request_ratio
        return None if ratio is None else swap_ratio_of(ratio)

    @property
    def recommended_value(self) -> float | None:
        """The new value of the profile's own knob."""
        ratio = self.recommended_request_ratio
        if ratio is None:
            return None
        return swap_ratio_of(ratio) if self.knob == "swapRatio" else float(ratio)

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "action": self.action,
            "knob": self.knob,
            "swapRatio": round(self.swap_ratio, 4),
            "requestRatio": round(float(self.request_ratio), 4),
            "recommended": None if self.recommended_request_ratio is None else {
                "swapRatio": self.recommended_swap_ratio,
                "requestRatio": round(float(self.recommended_request_ratio), 4),
            },
            "reasons": list(self.reasons),
            "evidence": self.evidence.as_dict(),
        }


def swap_ratio_of(request_ratio: Fraction) -> float:
    """swapRatio and requestRatio are one knob: request = limit / (1 + swapRatio)."""
    return round(float((1 - request_ratio) / request_ratio), 4)


def _percentile(values: Iterable[float], share: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def _evidence(found: list[ContainerUsage], left_out: int) -> Evidence:
    ratios = [c.working_set_p95 / c.request for c in found]
    maxima = [c.working_set_max / c.request for c in found]
    above = [c.above_request for c in found if c.above_request is not None]
    stalls = [c.stall for c in found if c.stall is not None]
    peaks = [c.stall_peak for c in found if c.stall_peak is not None]
    swaps = [c.swap_max for c in found if c.swap_max is not None]
    limited = [c.request / c.limit for c in found if c.limit]
    return Evidence(
        pods=len({(c.namespace, c.pod) for c in found}),
        containers=len(found),
        in_overridden_namespaces=left_out,
        samples_median=statistics.median(c.samples for c in found) if found else 0,
        working_set_over_request_p50=_percentile(ratios, 0.5),
        working_set_over_request_p95=_percentile(ratios, 0.95),
        working_set_over_request_max=max(maxima, default=None),
        above_request_share=statistics.fmean(above) if above else None,
        containers_above_request=sum(m > 1 for m in maxima),
        stall_share_p50=_percentile(stalls, 0.5),
        stall_share_p95=_percentile(stalls, 0.95),
        stall_peak_p95=_percentile(peaks, 0.95),
        swap_max_bytes=max(swaps, default=None),
        observed_request_ratio=statistics.median(limited) if limited else None,
    )


MIN_REQUEST_RATIO = Fraction(1, 100)  # the smallest ratio a recommendation is written with


def _rounded(ratio: float) -> Fraction:
    """A request ratio to two decimals, rounded up: toward the larger request, the safe side;
    within MIN_REQUEST_RATIO and MAX_REQUEST_RATIO whatever the figures (a ratio of 0 is no
    request at all, and a knob of 1/0)."""
    if not math.isfinite(ratio) or ratio >= MAX_REQUEST_RATIO:
        return MAX_REQUEST_RATIO
    return max(MIN_REQUEST_RATIO, Fraction(math.ceil(ratio * 100 - 1e-9), 100))


def _observed(evidence: Evidence) -> Fraction | None:
    """The request/limit the pods ran with, when it is a request ratio (0 < r < 1)."""
    observed = evidence.observed_request_ratio
    if observed is None or not math.isfinite(observed):
        return None
    ratio = Fraction(observed).limit_denominator(1000)
    return ratio if 0 < ratio < 1 else None


def _knob_value(ratio: Fraction, knob: Knob) -> Fraction:
    """The request ratio a user gets by writing the recommendation in the profile's knob:
    a swapRatio is given to one decimal, rounded down (toward the larger request)."""
    if knob == "requestRatio":
        return ratio
    swap = Fraction(math.floor((1 - ratio) / ratio * 10), 10)
    return 1 / (1 + swap) if swap > 0 else MAX_REQUEST_RATIO


def decide(name: str, current: Fraction, knob: Knob, evidence: Evidence,
           min_pods: int = DEFAULT_MIN_PODS, min_samples: int = DEFAULT_MIN_SAMPLES
           ) -> Recommendation:
    """The rules of the module's docstring, on one profile's evidence."""
    thin = []
    if evidence.pods < min_pods:
        thin.append(f"{evidence.pods} pod(s) of this profile in the window, fewer than "
                    f"{min_pods} (--min-pods)")
    if evidence.pods and evidence.samples_median < min_samples:
        thin.append(f"{evidence.samples_median:g} working-set samples per container (median), "
                    f"fewer than {min_samples} (--min-samples): a longer --window")
    if evidence.pods and evidence.stall_share_p95 is None:
        thin.append("no memory-pressure (PSI) figures for its containers")
    if thin:
        return Recommendation(name, "insufficient-data", knob, current, None, tuple(thin),
                              evidence)

    ratio = evidence.working_set_over_request_p95
    stall = evidence.stall_share_p95
    peak = evidence.stall_peak_p95 if evidence.stall_peak_p95 is not None else stall
    assert ratio is not None and stall is not None and peak is not None
    above = evidence.above_request_share or 0.0
    base = _observed(evidence) or current
    facts = (f"working set p95 {ratio:.0%} of the request, above it {above:.0%} of the "
             f"time; waited for memory {stall:.1%} of the time (p95), {peak:.1%} at the "
             f"worst")

    if stall >= STALLING and ratio >= PRESSED:
        target = _rounded(float(base) * max(ratio, 1.0) * (1 + HEADROOM + stall))
        target = _knob_value(target, knob)
        if target > current:
            reasons = [f"hot memory exceeds the request: {facts}"]
            if target >= MAX_REQUEST_RATIO:
                reasons.append("the request then nears the limit: reshaping these pods gains "
                               "little (consider leaving them out with podSelector)")
            return Recommendation(name, "lower", knob, current, target, tuple(reasons),
                                  evidence)
        return Recommendation(name, "keep", knob, current, None, (
            f"hot memory exceeded the request ({facts}), but the pods ran with smaller "
            f"requests than the profile gives now (request/limit {float(base):.2f} against "
            f"{float(current):.2f}): judge again once they run with the current policy",),
            evidence)
    if stall >= STALLING:
        return Recommendation(name, "keep", knob, current, None, (
            f"stalls while the working set stays within the request ({facts}): memory is "
            "short on the node for other reasons; the pressure guard keeps new pods off it",),
            evidence)
    if stall < CALM and peak < CALM_PEAK and ratio <= ROOMY and above <= SELDOM:
        target = _knob_value(_rounded(float(base) * ratio * (1 + HEADROOM)), knob)
        if target < current * (1 - Fraction(SMALL_CHANGE)):
            return Recommendation(name, "raise", knob, current, target, (
                f"hot memory stays well within the request: {facts}; a higher swapRatio "
                "packs more pods: check with `swapwise plan` that the nodes' swap backs "
                "them",), evidence)
    if stall >= CALM or peak >= CALM_PEAK:
        return Recommendation(name, "keep", knob, current, None, (
            f"some waiting for memory, too little to act on: {facts}",), evidence)
    if ratio > 1:
        return Recommendation(name, "keep", knob, current, None, (
            f"the working set exceeds the request but the pods do not wait for memory "
            f"({facts}): the nodes have RAM to spare and keep cold pages resident",), evidence)
    return Recommendation(name, "keep", knob, current, None, (
        f"the request fits the hot memory: {facts}",), evidence)


def _dropped_reason(dropped: Mapping[str, int]) -> str:
    """``7 container(s) left out: working set 0 bytes or below (5), no memory request (2)``."""
    counts = sorted(dropped.items(), key=lambda item: (-item[1], item[0]))
    return (f"{sum(dropped.values())} container(s) left out: "
            + ", ".join(f"{why} ({count})" for why, count in counts))


def recommend(usage: list[ContainerUsage], policy: Policy, knobs: Mapping[str, Knob],
              min_pods: int = DEFAULT_MIN_PODS, min_samples: int = DEFAULT_MIN_SAMPLES,
              dropped: Mapping[tuple[str, str], int] | None = None,
              ) -> list[Recommendation]:
    """One recommendation per profile of the policy, from the containers it reshaped.

    Pods in a namespace that overrides the profile (the policy's ``namespaces``) ran with
    other ratios: they are counted, not weighed. Profiles seen on pods but missing from the
    policy are reported as ``insufficient-data`` so a stale annotation does not go unseen.
    ``dropped`` (:attr:`~webhook.analysis.usage.Usage.dropped`): the containers left out for
    figures no memory can have, said in each profile's reasons.
    """
    overridden = {(profile, namespace) for profile, namespace in policy.overrides}
    lost: dict[str, dict[str, int]] = {}
    for (profile_name, why), count in (dropped or {}).items():
        lost.setdefault(profile_name, {})[why] = count
    found: list[Recommendation] = []
    for name in sorted(set(policy.profiles) | {c.profile for c in usage} | set(lost)):
        own = [c for c in usage if c.profile == name]
        kept = [c for c in own if (name, c.namespace) not in overridden]
        left_out = len({(c.namespace, c.pod) for c in own}) - len(
            {(c.namespace, c.pod) for c in kept})
        evidence = replace(_evidence(kept, left_out),
                           containers_left_out=sum(lost.get(name, {}).values()))
        profile = policy.profiles.get(name)
        if profile is None:
            found.append(Recommendation(
                name, "insufficient-data", "swapRatio",
                _observed(evidence) or DEFAULT_REQUEST_RATIO, None,
                (f"{evidence.pods} pod(s) carry this profile, which the policy does not "
                 "have (renamed or removed?)",
                 *([_dropped_reason(lost[name])] if name in lost else [])), evidence))
            continue
        decided = decide(name, profile.request_ratio, knobs.get(name, "swapRatio"), evidence,
                         min_pods, min_samples)
        if left_out:
            decided = replace(decided, reasons=(*decided.reasons, (
                f"{left_out} pod(s) in namespaces that override the profile were left out: "
                "they ran with other ratios")))
        if name in lost:
            decided = replace(decided, reasons=(*decided.reasons, _dropped_reason(lost[name])))
        found.append(decided)
    return found
