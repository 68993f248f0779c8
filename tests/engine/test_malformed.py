"""docs/rules.md: malformed pods are left unchanged with a warning (engine/pod.py)."""

from __future__ import annotations

import json
from typing import Any

import jsonpatch
import pytest

from testkit.engine_tables import DEFAULT
from testkit.pods import guaranteed
from webhook.engine import mutate_pod


@pytest.mark.parametrize(
    "p",
    [
        None, [], "pod", {"spec": "x"}, {"spec": {"containers": {}}},
        {"spec": {"containers": [{"resources": {}}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": {"memory": "lots"}}}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": "2Gi"}}]}},
        {"metadata": {"annotations": []}, "spec": {"containers": [guaranteed()]}},
        {"spec": {"containers": [guaranteed()], "affinity": []}},
    ],
)
def test_malformed_pods_are_left_unchanged(p: Any) -> None:
    mutation = mutate_pod(p, DEFAULT)
    assert mutation.patch == [] and mutation.skipped == "malformed"
    assert mutation.warnings and mutation.warnings[0].startswith("swapwise: pod left unchanged")


def _resources_pod(request: Any, limit: Any) -> dict[str, Any]:
    resources = {"requests": {"memory": request, "cpu": "1"}, "limits": {"memory": limit}}
    return {"spec": {"containers": [{"name": "a", "resources": resources}]}}


def test_cached_resource_blocks_never_answer_for_junk() -> None:
    """engine/pod.py caches parsed requests/limits by their text: a number equal to a
    cached key (True == 1) or an unhashable value must still be judged on its own."""
    assert mutate_pod(_resources_pod("2Gi", "2Gi"), DEFAULT).skipped is None
    assert mutate_pod(_resources_pod(1, 1), DEFAULT).skipped is None
    for request, limit in [(True, True), (["2Gi"], "2Gi"), ("2Gi", {"v": 1}), ("lots", "2Gi")]:
        for _ in range(2):  # and not cached by the first refusal
            mutation = mutate_pod(_resources_pod(request, limit), DEFAULT)
            assert mutation.skipped == "malformed", (request, limit)
    assert mutate_pod(_resources_pod("2Gi", "2Gi"), DEFAULT).patch


def _original(pod: dict[str, Any]) -> Any:
    result = jsonpatch.apply_patch(pod, mutate_pod(pod, DEFAULT).patch)
    return json.loads(result["metadata"]["annotations"]["swapwise.io/original"])


def test_the_recorded_original_is_each_containers_own_text() -> None:
    """The memory entries as written come from the same cache as the parsed ones: a
    number is recorded as its own text, a request copied from the limit as the limit's,
    whichever pod filled the cache first."""
    for _ in range(2):  # the second pass answers from the cache
        assert _original(_resources_pod("2Gi", "2Gi")) == {
            "a": {"request": "2Gi", "limit": "2Gi"}}
        assert _original(_resources_pod(2147483648, 2147483648)) == {
            "a": {"request": "2147483648", "limit": "2147483648"}}
        only_limit = {"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}}},
            {"name": "b", "resources": {"limits": {"memory": "2048Mi"}}}]}}
        assert _original(only_limit) == {"a": {"request": "2Gi", "limit": "2Gi"},
                                         "b": {"request": "2048Mi", "limit": "2048Mi"}}
