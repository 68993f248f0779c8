"""Property tests: docs/rules.md invariants over generated pods and profiles."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings

from tests.support.engine_check import apply
from tests.support.strategies import pods, profiles
from webhook.engine.pod import PodView
from webhook.engine.resources import raised_limit
from webhook.profile import Profile
from webhook.quantity import MI, parse_bytes


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
