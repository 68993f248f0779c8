"""docs/rules.md: memory requests and limits: the target formula (engine/resources.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.engine_check import apply
from testkit.engine_tables import (
    DEFAULT,
    NO_MARKS,
    SWAP_EXPR,
    backed,
    backing_warning,
    memory,
    profile,
    terms,
)
from testkit.pods import container, guaranteed, pod
from webhook.base.quantity import MI
from webhook.engine import mutate_pod
from webhook.engine.resources import effective_max_ratio, raised_limit, target


@pytest.mark.parametrize(
    ("limit", "expected", "need"),  # need: ceil(1000 x (limit - request) ÷ request)
    [
        ("2Gi", "683Mi", 1999),  # 2048/3 = 682.67 -> ceilMi
        ("2G", "636Mi", 1999),  # 2e9/3 bytes = 635.78Mi
        ("2e9", "636Mi", 1999),
        ("2000000000", "636Mi", 1999),
        ("1.5Gi", "512Mi", 2000),  # exactly twice the request above it
        ("1536Mi", "512Mi", 2000),
        ("3Gi", "1Gi", 2000),  # canonical: whole GiB
        ("32Mi", "16Mi", 1000),  # minRequest wins over 11Mi
        ("4Gi", "1366Mi", 1999),
    ],
)
def test_guaranteed_request_becomes_target(limit: str, expected: str, need: int) -> None:
    result, mutation = apply(pod(container(request=limit, limit=limit)), DEFAULT)
    assert memory(result) == {"request": expected, "limit": limit}
    assert result["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"
    assert result["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "100m"
    expected_warning = f"swapwise: app memory request {limit} -> {expected} (limit {limit})"
    assert mutation.warnings == [expected_warning, backing_warning(need)]
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, backed(need)]}]


def test_limit_only_arrives_as_guaranteed_and_gets_a_request() -> None:
    result, _ = apply(pod(container(limit="2Gi", cpu=None)), DEFAULT)
    assert memory(result) == {"request": "683Mi", "limit": "2Gi"}
    original = json.loads(result["metadata"]["annotations"]["swapwise.io/original"])
    # The API server defaults the request from the limit; the annotation says so too.
    assert original == {"app": {"request": "2Gi", "limit": "2Gi"}}


def test_limit_only_without_resources_requests_object() -> None:
    c = {"name": "app", "resources": {"limits": {"memory": "1Gi", "cpu": "1"}}}
    result, _ = apply(pod(c), DEFAULT)
    assert result["spec"]["containers"][0]["resources"]["requests"] == {"memory": "342Mi"}


@pytest.mark.parametrize(
    "c",
    [
        container(request="512Mi", limit="2Gi"),  # already burstable
        container(request="512Mi"),  # request only
    ],
)
def test_swap_eligible_containers_keep_their_resources(c: dict[str, Any]) -> None:
    before = json.loads(json.dumps(c))
    result, mutation = apply(pod(c), DEFAULT)
    assert result["spec"]["containers"][0].get("resources") == before.get("resources")
    assert "resizePolicy" not in result["spec"]["containers"][0]
    assert mutation.changes == []
    # Already swap-eligible, so it is still steered to swap nodes and annotated.
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS]}]
    assert result["metadata"]["annotations"] == {"swapwise.io/profile": "p"}


def test_no_memory_and_no_default_limit_is_left_alone() -> None:
    mutation = mutate_pod(pod(container(cpu=None)), DEFAULT)
    assert mutation.patch == [] and mutation.warnings == []


def test_default_limit_gives_limit_and_target_request() -> None:
    result, mutation = apply(pod(container(cpu=None)), profile(defaultLimit="2Gi"))
    assert memory(result) == {"request": "683Mi", "limit": "2Gi"}
    original = json.loads(result["metadata"]["annotations"]["swapwise.io/original"])
    assert original == {"app": {}}
    assert mutation.warnings == ["swapwise: app memory limit 2Gi (defaultLimit), request 683Mi",
                                 backing_warning(1999)]


def test_default_limit_keeps_cpu() -> None:
    c = {"name": "app", "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1"}}}
    result, _ = apply(pod(c), profile(defaultLimit="1Gi"))
    assert result["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "250m", "memory": "342Mi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }


def test_target_not_below_limit_leaves_container_and_warns() -> None:
    mutation = mutate_pod(pod(guaranteed("16Mi")), DEFAULT)
    assert mutation.patch == []  # still Guaranteed: nothing to place either
    assert mutation.warnings == [
        "swapwise: app memory left unchanged: request 16Mi would not be below limit 16Mi"
    ]


def test_max_limit_request_ratio_raises_the_request() -> None:
    result, _ = apply(pod(guaranteed("2Gi")), profile(maxLimitRequestRatio=2))
    assert memory(result)["request"] == "1Gi"


def test_request_ratio_spelled_directly() -> None:
    result, _ = apply(pod(guaranteed("1Gi")), profile(requestRatio=0.25))
    assert memory(result)["request"] == "256Mi"


def test_min_request_in_decimal_form_is_written_canonically() -> None:
    result, _ = apply(pod(guaranteed("100Mi")), profile(minRequest="64M"))
    assert memory(result)["request"] == "64M"


def test_cpu_and_other_resources_never_touched() -> None:
    c = {
        "name": "gpu",
        "resources": {
            "requests": {"memory": "4Gi", "cpu": "2", "nvidia.com/gpu": "1",
                         "ephemeral-storage": "1Gi", "hugepages-2Mi": "20Mi"},
            "limits": {"memory": "4Gi", "cpu": "2", "nvidia.com/gpu": "1",
                       "ephemeral-storage": "1Gi", "hugepages-2Mi": "20Mi"},
        },
    }
    result, _ = apply(pod(c), DEFAULT)
    resources = result["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"memory": "1366Mi", "cpu": "2", "nvidia.com/gpu": "1",
                                     "ephemeral-storage": "1Gi", "hugepages-2Mi": "20Mi"}
    assert resources["limits"] == c["resources"]["limits"]


def test_multi_container_changes_only_guaranteed_ones_with_one_warning_each() -> None:
    p = pod(guaranteed("1Gi", name="a"), container("b", request="100Mi", limit="1Gi"),
            guaranteed("3Gi", name="c"))
    result, mutation = apply(p, DEFAULT)
    assert [memory(result, i)["request"] for i in range(3)] == ["342Mi", "100Mi", "1Gi"]
    # One per changed container, and the pod's backing: a (1Gi -> 342Mi) needs 1995‰ and
    # c (3Gi -> 1Gi) 2000‰; b, left as it came, needs 9240‰ but is not counted.
    assert mutation.warnings[2:] == [backing_warning(2000)] and len(mutation.warnings) == 3
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, backed(2000)]}]
    assert json.loads(result["metadata"]["annotations"]["swapwise.io/original"]) == {
        "a": {"request": "1Gi", "limit": "1Gi"}, "c": {"request": "3Gi", "limit": "3Gi"}}


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(1, 64 * 1024).map(lambda mi: mi * MI),
       ratio=st.sampled_from(["0.1", "0.25", "0.33", "0.5", "0.9"]),
       cap=st.sampled_from([None, "1.5", "2", "4", "8", "100"]))
def test_no_reshaped_container_exceeds_the_effective_max_ratio(limit: int, ratio: str,
                                                                cap: str | None) -> None:
    """effective_max_ratio bounds limit/request of what target and raised_limit write (what
    audit compares with a LimitRange's maxLimitRequestRatio)."""
    fields: dict[str, Any] = {"requestRatio": float(ratio), "minRequest": "1Mi"}
    if cap is not None:
        fields["maxLimitRequestRatio"] = float(cap)
    p = profile(**fields)
    bound = effective_max_ratio(p)
    assert limit <= bound * target(limit, p)
    raised = raised_limit(limit, p)
    assert raised <= bound * limit
