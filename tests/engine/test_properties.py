"""Property tests: docs/rules.md invariants over generated pods and profiles."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.engine_check import apply
from testkit.engine_tables import NO_MARKS, PERMILLE, REQUIRED
from testkit.strategies import pods, profiles, required_affinity
from webhook.base.quantity import MI, parse_bytes
from webhook.engine.backing import container_need
from webhook.engine.mutate import uses_swap
from webhook.engine.pod import PodView
from webhook.engine.resources import raised_limit
from webhook.profile import Profile

# Thousands of drawn pods and profiles: a minute of `make unit`, left out of `make quick`.
pytestmark = pytest.mark.slow


@settings(max_examples=1500, deadline=None)
@given(pod=pods(), profile=profiles())
def test_invariants(pod: dict[str, Any], profile: Profile) -> None:
    result, mutation = apply(pod, profile)  # applies, nothing else changes, 2nd pass empty
    after = PodView.parse(result)
    before = {c.path: c for c in PodView.parse(pod).containers}
    for change in mutation.changes:
        container = next(c for c in after.containers if c.path == change.container.path)
        request, limit = container.memory_request, container.memory_limit
        assert request is not None and limit is not None
        assert request < limit, "a changed container must end up swap-eligible"
        if change.limit_raised:  # vpaPods: raiseLimit - the VPA's request is kept
            assert request == before[container.path].memory_request
            assert limit == raised_limit(change.request, profile) and limit % MI == 0
            assert limit * profile.request_ratio <= request
            continue
        assert request >= profile.min_request
        assert request == profile.min_request or request % MI == 0
        # CPU is never touched.
        assert container.requests.get("cpu") == before[container.path].requests.get("cpu")
        assert container.limits.get("cpu") == before[container.path].limits.get("cpu")
    if mutation.skipped is not None:
        assert mutation.patch == []
    for path, original in before.items():
        if path not in {c.container.path for c in mutation.changes}:
            resources = (original.raw.get("resources") or {})
            now = next(c for c in after.containers if c.path == path).raw.get("resources")
            assert (now or {}) == resources or now == resources


@settings(max_examples=300, deadline=None)
@given(pod=pods(), profile=profiles())
def test_limit_stays_as_written_for_changed_containers(
    pod: dict[str, Any], profile: Profile
) -> None:
    result, mutation = apply(pod, profile)
    for change in mutation.changes:
        if not change.limit_added:
            index = int(change.container.path.rsplit("/", 1)[1])
            field = change.container.path.split("/")[2]
            written = result["spec"][field][index]["resources"]["limits"]["memory"]
            assert parse_bytes(written) == change.limit


def _required_terms(pod: dict[str, Any]) -> list[Any]:
    affinity = pod["spec"].get("affinity") or {}
    node = affinity.get("nodeAffinity") or {}
    return list(((node.get(REQUIRED) or {}).get("nodeSelectorTerms")) or [])


def _swapwise_values(term: Any) -> list[int]:
    """Values of the term's earlier-swapwise-style entries (Gt, one decimal integer)."""
    out = []
    for e in (term or {}).get("matchExpressions") or []:
        values = e.get("values") or []
        if e.get("key") == PERMILLE and e.get("operator") == "Gt" and len(values) == 1 \
                and values[0].isascii() and values[0].isdigit():
            out.append(int(values[0]))
    return out


@settings(max_examples=1000, deadline=None)
@given(pod=pods(), profile=profiles(), affinity=st.one_of(st.none(), required_affinity),
       required=st.booleans())
def test_swap_backing(pod: dict[str, Any], profile: Profile, affinity: dict[str, Any] | None,
                      required: bool) -> None:
    """docs/rules.md "Swap backing": every required term ends up requiring at least the
    pod's need, with one swapwise entry at most added per term and none stacked."""
    if affinity is not None:  # own required terms, on the swap-permille key too, more often
        pod["spec"]["affinity"] = affinity
    if required:
        profile = dataclasses.replace(profile, placement=dataclasses.replace(
            profile.placement, mode="required"))
    result, mutation = apply(pod, profile)
    need = max((container_need(c.request, c.limit) for c in mutation.changes), default=0)
    warned = [w for w in mutation.warnings if "needs nodes whose swap" in w]
    applies = (need > 0 and profile.placement.mode == "required"
               and profile.placement.swap_backing == "required")
    spec = pod["spec"]
    owned = any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences", []))
    if applies and not spec.get("nodeName") and not owned and "resources" not in spec:
        assert warned, "a reshaped pod with required placement must need backed nodes"
    if not warned:
        assert [_swapwise_values(t) for t in _required_terms(result)][:len(
            _required_terms(pod))] == [_swapwise_values(t) for t in _required_terms(pod)]
        return
    assert applies and warned == [w for w in warned if f">= {need}\u2030 " in w]
    assert len(warned) == 1
    before = _required_terms(pod)
    after = _required_terms(result)
    assert after and (len(after) == len(before) or not before)
    for index, term in enumerate(after):
        values = _swapwise_values(term)
        assert values and max(values) >= need - 1, term
        earlier = _swapwise_values(before[index]) if before else []
        assert len(values) == max(len(earlier), 1), (before[index] if before else None, term)
        if earlier and max(earlier) >= need - 1:  # implied already: left alone
            assert _on_key(term) == _on_key(before[index])


def _on_key(term: Any) -> list[Any]:
    return [e for e in (term or {}).get("matchExpressions") or [] if e.get("key") == PERMILLE]


def _pressure_entries(term: Any, key: str) -> list[Any]:
    return [e for e in (term or {}).get("matchExpressions") or [] if e.get("key") == key]


@settings(max_examples=1000, deadline=None)
@given(pod=pods(), profile=profiles(), affinity=st.one_of(st.none(), required_affinity),
       required=st.booleans())
def test_pressure_entry(pod: dict[str, Any], profile: Profile, affinity: dict[str, Any] | None,
                        required: bool) -> None:
    """docs/rules.md "The pressure marks": a pod that gets required placement ends with
    swapwise's DoesNotExist on each mark's key in every required term, added once to a term
    that lacks it; the user's entries on the key stay as they were; no other pod gains or
    loses one."""
    if affinity is not None:
        pod["spec"]["affinity"] = affinity
    if required:
        profile = dataclasses.replace(profile, placement=dataclasses.replace(
            profile.placement, mode="required"))
    result, mutation = apply(pod, profile)
    before, after = _required_terms(pod), _required_terms(result)
    owned = any(o.get("kind") == "DaemonSet" for o in pod["metadata"].get("ownerReferences", []))
    placed = (mutation.skipped is None and profile.placement.mode == "required"
              and not pod["spec"].get("nodeName") and not owned
              and uses_swap(PodView.parse(result), []))
    for ours in NO_MARKS:
        key = ours["key"]
        if not placed:
            assert [_pressure_entries(t, key) for t in after][:len(before)] == \
                [_pressure_entries(t, key) for t in before]
            assert len(after) == len(before)
            continue
        assert after and (len(after) == len(before) or not before)
        for index, term in enumerate(after):
            entries = _pressure_entries(term, key)
            earlier = _pressure_entries(before[index], key) if before else []
            if ours in earlier:  # there already: the term's entries on the key unchanged
                assert entries == earlier
            else:  # added once, after the user's own entries on the key
                assert entries == [*earlier, ours]
