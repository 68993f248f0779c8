"""docs/rules.md, rule by rule, over many pod shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.engine_check import apply
from tests.pods import container, guaranteed, pod
from webhook.engine import mutate_pod
from webhook.policy import build_policy
from webhook.profile import Profile

SWAP = "feature.node.kubernetes.io/memory-swap"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
SWAP_EXPR = {"key": SWAP, "operator": "In", "values": ["true"]}


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


# --- resources -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("2Gi", "683Mi"),  # 2048/3 = 682.67 -> ceilMi
        ("2G", "636Mi"),  # 2e9/3 bytes = 635.78Mi
        ("2e9", "636Mi"),
        ("2000000000", "636Mi"),
        ("1.5Gi", "512Mi"),
        ("1536Mi", "512Mi"),
        ("3Gi", "1Gi"),  # canonical: whole GiB
        ("32Mi", "16Mi"),  # minRequest wins over 11Mi
        ("4Gi", "1366Mi"),
    ],
)
def test_guaranteed_request_becomes_target(limit: str, expected: str) -> None:
    result, mutation = apply(pod(container(request=limit, limit=limit)), DEFAULT)
    assert memory(result) == {"request": expected, "limit": limit}
    assert result["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"
    assert result["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "100m"
    expected_warning = f"swapwise: app memory request {limit} -> {expected} (limit {limit})"
    assert mutation.warnings == [expected_warning]


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
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR]}]
    assert result["metadata"]["annotations"] == {"swapwise.io/profile": "p"}


def test_no_memory_and_no_default_limit_is_left_alone() -> None:
    mutation = mutate_pod(pod(container(cpu=None)), DEFAULT)
    assert mutation.patch == [] and mutation.warnings == []


def test_default_limit_gives_limit_and_target_request() -> None:
    result, mutation = apply(pod(container(cpu=None)), profile(defaultLimit="2Gi"))
    assert memory(result) == {"request": "683Mi", "limit": "2Gi"}
    original = json.loads(result["metadata"]["annotations"]["swapwise.io/original"])
    assert original == {"app": {}}
    assert mutation.warnings == ["swapwise: app memory limit 2Gi (defaultLimit), request 683Mi"]


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
    assert len(mutation.warnings) == 2
    assert json.loads(result["metadata"]["annotations"]["swapwise.io/original"]) == {
        "a": {"request": "1Gi", "limit": "1Gi"}, "c": {"request": "3Gi", "limit": "3Gi"}}


# --- init containers, sidecars and resizePolicy --------------------------------------


def test_init_containers_changed_but_plain_ones_get_no_resize_policy() -> None:
    sidecar = guaranteed("1Gi", name="proxy") | {"restartPolicy": "Always"}
    p = pod(guaranteed("2Gi"), init=[guaranteed("1Gi", name="setup"), sidecar])
    result, _ = apply(p, DEFAULT)
    setup, proxy = result["spec"]["initContainers"]
    assert memory(result, 0, "initContainers")["request"] == "342Mi"
    assert memory(result, 1, "initContainers")["request"] == "342Mi"
    assert "resizePolicy" not in setup
    restart = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    assert proxy["resizePolicy"] == restart
    assert result["spec"]["containers"][0]["resizePolicy"] == proxy["resizePolicy"]


@pytest.mark.parametrize("restart", ["Never"])
def test_restart_policy_never_gets_no_resize_policy(restart: str) -> None:
    sidecar = guaranteed("1Gi", name="proxy") | {"restartPolicy": "Always"}
    result, _ = apply(pod(guaranteed(), init=[sidecar], restartPolicy=restart), DEFAULT)
    assert "resizePolicy" not in result["spec"]["containers"][0]
    assert "resizePolicy" not in result["spec"]["initContainers"][0]
    assert memory(result)["request"] == "683Mi"


def test_restart_policy_on_failure_gets_resize_policy() -> None:
    result, _ = apply(pod(guaranteed(), restartPolicy="OnFailure"), DEFAULT)
    assert result["spec"]["containers"][0]["resizePolicy"][0]["restartPolicy"] == "RestartContainer"


def test_existing_memory_resize_policy_is_replaced_with_a_warning() -> None:
    c = guaranteed() | {"resizePolicy": [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "NotRequired"},
    ]}
    result, mutation = apply(pod(c), DEFAULT)
    assert result["spec"]["containers"][0]["resizePolicy"] == [
        {"resourceName": "cpu", "restartPolicy": "NotRequired"},
        {"resourceName": "memory", "restartPolicy": "RestartContainer"},
    ]
    assert any("resizePolicy NotRequired -> RestartContainer" in w for w in mutation.warnings)


def test_cpu_only_resize_policy_gets_memory_appended() -> None:
    c = guaranteed() | {"resizePolicy": [{"resourceName": "cpu", "restartPolicy": "NotRequired"}]}
    result, _ = apply(pod(c), DEFAULT)
    assert result["spec"]["containers"][0]["resizePolicy"][1] == {
        "resourceName": "memory", "restartPolicy": "RestartContainer"}


def test_resize_policy_keep() -> None:
    result, _ = apply(pod(guaranteed()), profile(resizePolicy="keep"))
    assert "resizePolicy" not in result["spec"]["containers"][0]


# --- placement -----------------------------------------------------------------------


def test_required_placement_created_from_nothing() -> None:
    result, _ = apply(pod(guaranteed()), DEFAULT)
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR]}]


def test_every_required_term_gets_the_expression() -> None:
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    affinity = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [zone]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
        {"matchExpressions": [SWAP_EXPR]},
    ]}}, "podAntiAffinity": {}}
    result, _ = apply(pod(guaranteed(), affinity=affinity), DEFAULT)
    t = terms(result)
    assert t[0]["matchExpressions"] == [zone, SWAP_EXPR]
    assert t[1]["matchExpressions"] == [SWAP_EXPR] and "matchFields" in t[1]
    assert t[2]["matchExpressions"] == [SWAP_EXPR]
    assert result["spec"]["affinity"]["podAntiAffinity"] == {}


def test_existing_preferred_affinity_kept_when_adding_required() -> None:
    preferred = [{"weight": 5, "preference": {"matchExpressions": [
        {"key": "x", "operator": "Exists"}]}}]
    result, _ = apply(pod(guaranteed(), affinity={"nodeAffinity": {PREFERRED: preferred}}),
                      DEFAULT)
    assert result["spec"]["affinity"]["nodeAffinity"][PREFERRED] == preferred
    assert terms(result) == [{"matchExpressions": [SWAP_EXPR]}]


def test_multiple_node_selector_pairs_all_added() -> None:
    prof = profile(placement={"nodeSelector": {SWAP: "true", "pool": "swap"}})
    result, _ = apply(pod(guaranteed()), prof)
    assert terms(result) == [{"matchExpressions": [
        SWAP_EXPR, {"key": "pool", "operator": "In", "values": ["swap"]}]}]


def test_preferred_placement_added_once() -> None:
    prof = profile(placement={"mode": "preferred", "weight": 40})
    result, _ = apply(pod(guaranteed()), prof)
    assert result["spec"]["affinity"]["nodeAffinity"] == {
        PREFERRED: [{"weight": 40, "preference": {"matchExpressions": [SWAP_EXPR]}}]}


def test_preferred_appends_to_existing_terms() -> None:
    other = {"weight": 1, "preference": {"matchExpressions": [{"key": "x", "operator": "Exists"}]}}
    prof = profile(placement={"mode": "preferred"})
    result, _ = apply(pod(guaranteed(), affinity={"nodeAffinity": {PREFERRED: [other]}}), prof)
    assert result["spec"]["affinity"]["nodeAffinity"][PREFERRED] == [
        other, {"weight": 100, "preference": {"matchExpressions": [SWAP_EXPR]}}]


def test_placement_none() -> None:
    result, _ = apply(pod(guaranteed()), profile(placement={"mode": "none"}))
    assert "affinity" not in result["spec"]
    assert memory(result)["request"] == "683Mi"


def test_tolerations_appended_unless_equal_exists() -> None:
    swap_taint = {"key": "swap", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    other = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    prof = profile(placement={"tolerations": [swap_taint, other]})
    existing = [{"key": "swap", "value": "true", "effect": "NoSchedule"}]  # operator defaults
    result, _ = apply(pod(guaranteed(), tolerations=existing), prof)
    assert result["spec"]["tolerations"] == [*existing, other]
    fresh, _ = apply(pod(guaranteed()), prof)
    assert fresh["spec"]["tolerations"] == [swap_taint, other]


@pytest.mark.parametrize(
    "extra",
    [
        {"nodeName": "node-1"},
    ],
)
def test_no_placement_for_bound_pods(extra: dict[str, Any]) -> None:
    result, _ = apply(pod(guaranteed(), **extra), DEFAULT)
    assert "affinity" not in result["spec"]
    assert memory(result)["request"] == "683Mi"


def test_no_placement_for_daemonset_pods() -> None:
    p = pod(guaranteed())
    p["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "1",
         "controller": True}]
    result, _ = apply(p, DEFAULT)
    assert "affinity" not in result["spec"]
    assert memory(result)["request"] == "683Mi"
    template, _ = apply(pod(guaranteed()), DEFAULT, daemonset=True)
    assert "affinity" not in template["spec"]


def test_no_placement_when_nothing_can_swap() -> None:
    # BestEffort: no memory anywhere.
    assert mutate_pod(pod(container(cpu=None)), DEFAULT).patch == []


def test_pod_level_resources_keep_pod_guaranteed_so_no_placement() -> None:
    p = pod(guaranteed("1Gi"), resources={"requests": {"memory": "1Gi", "cpu": "500m"},
                                          "limits": {"memory": "1Gi", "cpu": "500m"}})
    result, _ = apply(p, DEFAULT)
    assert memory(result)["request"] == "342Mi"
    assert "affinity" not in result["spec"]
    assert result["spec"]["resources"] == p["spec"]["resources"]


# --- pods left exactly as they came ---------------------------------------------------


@pytest.mark.parametrize(
    ("p", "reason"),
    [
        (pod(guaranteed(), labels={"swapwise.io/skip": "true"}), "opted out"),
        (pod(guaranteed(), annotations={"swapwise.io/skip": "true"}), "opted out"),
        (pod(guaranteed(), priorityClassName="system-node-critical"), "critical pod"),
        (pod(guaranteed(), priorityClassName="system-cluster-critical"), "critical pod"),
        (pod(guaranteed(), priority=2_000_000_000), "critical pod"),
        (pod(guaranteed(), priority=2_000_001_000), "critical pod"),
        (pod(guaranteed(), annotations={"kubernetes.io/config.mirror": "abc"}), "critical pod"),
        (pod(guaranteed(), os={"name": "windows"}), "windows pod"),
    ],
)
def test_untouched_pods(p: dict[str, Any], reason: str) -> None:
    mutation = mutate_pod(p, DEFAULT)
    assert mutation.patch == [] and mutation.skipped == reason


def test_high_but_not_critical_priority_is_mutated() -> None:
    result, _ = apply(pod(guaranteed(), priority=1_999_999_999), DEFAULT)
    assert memory(result)["request"] == "683Mi"


def test_skip_false_is_not_an_opt_out() -> None:
    result, _ = apply(pod(guaranteed(), labels={"swapwise.io/skip": "false"}), DEFAULT)
    assert memory(result)["request"] == "683Mi"


def test_linux_os_is_mutated() -> None:
    result, _ = apply(pod(guaranteed(), os={"name": "linux"}), DEFAULT)
    assert memory(result)["request"] == "683Mi"


def test_pod_selector() -> None:
    prof = profile(podSelector={
        "matchLabels": {"app.kubernetes.io/component": "sandbox"},
        "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]},
                             {"key": "legacy", "operator": "DoesNotExist"}],
    })
    sandbox = {"app.kubernetes.io/component": "sandbox"}
    assert mutate_pod(pod(guaranteed()), prof).skipped == "podSelector does not match"
    assert mutate_pod(pod(guaranteed(), labels=sandbox | {"tier": "db"}), prof).patch == []
    assert mutate_pod(pod(guaranteed(), labels=sandbox | {"legacy": ""}), prof).patch == []
    result, _ = apply(pod(guaranteed(), labels=sandbox | {"tier": "web"}), prof)
    assert memory(result)["request"] == "683Mi"


def test_pod_selector_in_and_exists() -> None:
    prof = profile(podSelector={"matchExpressions": [
        {"key": "app", "operator": "In", "values": ["a", "b"]},
        {"key": "team", "operator": "Exists"}]})
    assert mutate_pod(pod(guaranteed(), labels={"app": "b", "team": "x"}), prof).patch
    assert not mutate_pod(pod(guaranteed(), labels={"app": "c", "team": "x"}), prof).patch
    assert not mutate_pod(pod(guaranteed(), labels={"app": "a"}), prof).patch


def test_guaranteed_pods_skip() -> None:
    prof = profile(guaranteedPods="skip")
    assert mutate_pod(pod(guaranteed()), prof).skipped == "guaranteed pod (guaranteedPods: skip)"
    # Burstable (cpu request < limit) with a memory request == limit: converted.
    c = {"name": "app", "resources": {"requests": {"memory": "1Gi", "cpu": "100m"},
                                      "limits": {"memory": "1Gi", "cpu": "1"}}}
    result, _ = apply(pod(c), prof)
    assert memory(result)["request"] == "342Mi"


# --- annotations and JSON Pointers ----------------------------------------------------


def test_annotations_created_when_pod_has_none() -> None:
    p = pod(guaranteed())
    assert "annotations" not in p["metadata"]
    mutation = mutate_pod(p, DEFAULT)
    ops = [op for op in mutation.patch if op["path"].startswith("/metadata")]
    assert ops == [{"op": "add", "path": "/metadata/annotations", "value": {
        "swapwise.io/profile": "p",
        "swapwise.io/original": '{"app":{"request":"2Gi","limit":"2Gi"}}'}}]


def test_annotation_keys_are_escaped_in_json_pointers() -> None:
    p = pod(guaranteed(), annotations={"team.example/owner~x": "me"})
    mutation = mutate_pod(p, DEFAULT)
    paths = [op["path"] for op in mutation.patch if op["path"].startswith("/metadata")]
    assert paths == ["/metadata/annotations/swapwise.io~1profile",
                     "/metadata/annotations/swapwise.io~1original"]
    result, _ = apply(p, DEFAULT)
    assert result["metadata"]["annotations"]["team.example/owner~x"] == "me"


def test_pod_without_metadata() -> None:
    p = {"spec": {"containers": [guaranteed()]}}
    result, _ = apply(p, DEFAULT)
    assert result["metadata"]["annotations"]["swapwise.io/profile"] == "p"


def test_original_annotation_keeps_earlier_entries() -> None:
    earlier = '{"app":{"request":"4Gi","limit":"4Gi"}}'
    p = pod(guaranteed("1Gi"), guaranteed("1Gi", name="b"),
            annotations={"swapwise.io/original": earlier, "swapwise.io/profile": "p"})
    result, _ = apply(p, DEFAULT)
    assert json.loads(result["metadata"]["annotations"]["swapwise.io/original"]) == {
        "app": {"request": "4Gi", "limit": "4Gi"}, "b": {"request": "1Gi", "limit": "1Gi"}}


def test_profile_annotation_replaced_when_different() -> None:
    p = pod(guaranteed(), annotations={"swapwise.io/profile": "other"})
    result, _ = apply(p, DEFAULT)
    assert result["metadata"]["annotations"]["swapwise.io/profile"] == "p"


def test_long_container_names_keep_warnings_short() -> None:
    name = "x" * 63
    _, mutation = apply(pod(guaranteed("1610612736", name=name)), DEFAULT)
    assert len(mutation.warnings[0]) == 120 and mutation.warnings[0].endswith("...")


# --- malformed input -----------------------------------------------------------------


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
