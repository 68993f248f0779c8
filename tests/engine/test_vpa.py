"""Pods a VerticalPodAutoscaler manages (docs/vpa.md): detection, vpaPods skip | raiseLimit.

The annotations are the ones the VPA 1.5 admission controller writes (tests/e2e/test_vpa.py
has the real one write them).
"""

from __future__ import annotations

import copy
import io
import json
from fractions import Fraction
from typing import Any

import pytest

from testkit.engine_check import apply
from testkit.engine_tables import backing_warning, profile
from testkit.pods import container, guaranteed, pod
from webhook.analysis.planner import Node
from webhook.analysis.vpa_manifests import as_admitted, without_admission_marks
from webhook.cli.plan_cmd import plan
from webhook.cli.preview_cmd import preview
from webhook.engine import mutate_pod
from webhook.engine.pod import PodView
from webhook.engine.resources import raised_limit
from webhook.engine.vpa import vpa_memory_containers
from webhook.policy import PolicyError, build_policy
from webhook.profile import Profile

MI, GI = 1024**2, 1024**3
UPDATED = "Pod resources updated by web: "
MANAGED = {"vpaObservedContainers": "app",
           "vpaUpdates": UPDATED + "container 0: cpu request, memory request, memory limit"}
SKIP_WARNING = ("swapwise: pod left unchanged: a VerticalPodAutoscaler manages its memory "
                "(vpaPods: skip)")


SKIP, RAISE = profile(vpaPods="skip"), profile()


def memory(result: dict[str, Any], index: int = 0, field: str = "containers") -> tuple[Any, Any]:
    resources = result["spec"][field][index]["resources"]
    return resources["requests"].get("memory"), resources["limits"].get("memory")


# --- detection -----------------------------------------------------------------------------


@pytest.mark.parametrize(("annotations", "expected"), [
    (None, None),
    ({"unrelated": "x"}, None),
    ({"vpaObservedContainers": "app"}, {"app"}),
    # without the observed list: every regular container, unless it got only other resources
    ({"vpaUpdates": UPDATED + "container 0: memory request, memory limit"}, {"app", "log"}),
    # admitted before the VPA had a recommendation: it sets nothing yet, but will
    ({"vpaObservedContainers": "app", "vpaUpdates": UPDATED + "container 0: "}, {"app"}),
    # controlledResources: [cpu] - the VPA sets only CPU on it: memory is swapwise's
    ({"vpaObservedContainers": "app", "vpaUpdates": UPDATED + "container 0: cpu request"},
     set()),
    ({"vpaObservedContainers": "app, log",
      "vpaUpdates": UPDATED + "container 0: cpu request; container 1: memory request"}, {"log"}),
    # names it observed that the pod does not have, and junk, are ignored
    ({"vpaObservedContainers": "other, app", "vpaUpdates": "junk; container x: y"}, {"app"}),
    ({"vpaObservedContainers": ""}, set()),
])
def test_vpa_memory_containers(annotations: dict[str, str] | None,
                               expected: set[str] | None) -> None:
    view = PodView.parse(pod(guaranteed("1Gi"), container("log", "64Mi", "64Mi"),
                             annotations=annotations))
    found = vpa_memory_containers(view)
    assert found == (None if expected is None else frozenset(expected))


def test_init_containers_and_sidecars_are_never_vpa_managed() -> None:
    sidecar = container("proxy", "64Mi", "64Mi", restartPolicy="Always")
    view = PodView.parse(pod(guaranteed("1Gi"), init=[container("init", "64Mi", "64Mi"), sidecar],
                             annotations={"vpaObservedContainers": "app, init, proxy"}))
    assert vpa_memory_containers(view) == frozenset({"app"})


# --- vpaPods: skip ---------------------------------------------------------------------------


def test_raise_limit_is_the_default() -> None:
    """The default must hold in either webhook order: swapwise's chart name sorts before the
    VPA's, and swapwise first then the VPA gives the raiseLimit shape (docs/vpa.md)."""
    assert Profile("p").vpa_pods == "raiseLimit" and RAISE.vpa_pods == "raiseLimit"
    assert SKIP.vpa_pods == "skip"


def test_skip_leaves_a_vpa_managed_pod_exactly_as_it_came() -> None:
    mutation = mutate_pod(pod(guaranteed("1Gi"), annotations=MANAGED), SKIP)
    assert mutation.patch == []
    assert mutation.warnings == [SKIP_WARNING]
    assert mutation.skipped == "managed by a VerticalPodAutoscaler (vpaPods: skip)"


def test_skip_on_the_reinvocation_after_the_vpa_keeps_what_the_vpa_made() -> None:
    """swapwise ran first (2Gi -> 683Mi), then the VPA: request 1Gi, limit scaled x2048/683."""
    vpa_made = pod(container("app", "1Gi", str(2 * GI * GI // (683 * MI))), annotations={
        **MANAGED, "swapwise.io/profile": "p",
        "swapwise.io/original": '{"app":{"request":"2Gi","limit":"2Gi"}}'})
    mutation = mutate_pod(vpa_made, SKIP)
    assert mutation.patch == []
    assert mutation.warnings == [
        "swapwise: VerticalPodAutoscaler ran after swapwise reshaped this pod; its memory "
        "requests are the VPA's (docs/vpa.md)"]


def test_a_vpa_that_sets_only_cpu_does_not_stop_reshaping() -> None:
    annotations = {"vpaObservedContainers": "app",
                   "vpaUpdates": UPDATED + "container 0: cpu request, cpu limit"}
    result, mutation = apply(pod(guaranteed("2Gi"), annotations=annotations), SKIP)
    assert memory(result) == ("683Mi", "2Gi")
    assert mutation.warnings == ["swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)",
                                 backing_warning(1999)]


def test_other_skip_rules_come_first() -> None:
    opted_out = pod(guaranteed("1Gi"), annotations={**MANAGED, "swapwise.io/skip": "true"})
    mutation = mutate_pod(opted_out, SKIP)
    assert mutation.skipped == "opted out" and mutation.warnings == []


# --- vpaPods: raiseLimit ---------------------------------------------------------------------


def test_raise_limit_keeps_the_vpa_request_and_raises_the_limit() -> None:
    result, mutation = apply(pod(guaranteed("1Gi"), annotations=MANAGED), RAISE)
    assert memory(result) == ("1Gi", "3Gi")
    assert not any(op["path"].endswith("/requests/memory") for op in mutation.patch)
    assert mutation.warnings == [
        "swapwise: app memory limit 1Gi -> 3Gi (request 1Gi kept: a VerticalPodAutoscaler sets it)",
        backing_warning(2000)]  # the raised limit counts: 1000 x 2Gi / 1Gi
    annotations = result["metadata"]["annotations"]
    assert json.loads(annotations["swapwise.io/original"]) == {
        "app": {"request": "1Gi", "limit": "1Gi"}}
    assert result["spec"]["containers"][0]["resizePolicy"] == [
        {"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    assert result["spec"]["affinity"]["nodeAffinity"]
    assert result["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "500m"


@pytest.mark.parametrize(("fields", "request_", "limit"), [
    ({}, "1Gi", "3Gi"),
    ({"swapRatio": 1}, "1Gi", "2Gi"),
    ({"requestRatio": 0.25}, "512Mi", "2Gi"),
    ({"maxLimitRequestRatio": 2}, "1Gi", "2Gi"),  # the LimitRange's ratio caps it
    ({}, "1000000000", "2861Mi"),  # floorMi(3e9 bytes): whole MiB, never above 3x
    ({}, "683Mi", "2049Mi"),
    ({}, "100M", "286Mi"),
])
def test_raised_limit(fields: dict[str, Any], request_: str, limit: str) -> None:
    result, _ = apply(pod(guaranteed(request_), annotations=MANAGED),
                      profile(vpaPods="raiseLimit", **fields))
    assert memory(result) == (request_, limit)


def test_raised_limit_is_floor_of_request_over_ratio() -> None:
    assert raised_limit(GI, RAISE) == 3 * GI
    assert raised_limit(GI + 1, RAISE) == 3 * GI
    assert raised_limit(GI - 1, RAISE) == 3 * GI - MI


def test_raise_limit_that_would_not_be_above_the_request_leaves_it_and_warns() -> None:
    mutation = mutate_pod(pod(guaranteed("10Mi"), annotations=MANAGED),
                          profile(vpaPods="raiseLimit", requestRatio=0.99))
    assert mutation.patch == []
    assert mutation.warnings == [
        "swapwise: app memory left unchanged: limit 10Mi would not be above request 10Mi"]


@pytest.mark.parametrize("c", [
    container("app", "1Gi", "3Gi"),  # the VPA scaled swapwise's ratio: swap-eligible already
    container("app", "1Gi", None),  # request only
    container("app", None, None),  # nothing: the VPA owns the request, defaultLimit is not used
])
def test_raise_limit_never_writes_the_request_of_a_vpa_managed_container(
    c: dict[str, Any],
) -> None:
    mutation = mutate_pod(pod(c, annotations=MANAGED), profile(vpaPods="raiseLimit",
                                                              defaultLimit="2Gi"))
    assert not any("/resources" in op["path"] for op in mutation.patch)


def test_raise_limit_reshapes_what_the_vpa_does_not_manage_as_usual() -> None:
    """Init containers (a VPA never sets them) and CPU-only containers get lower requests."""
    annotations = {"vpaObservedContainers": "app, log", "vpaUpdates": UPDATED
                   + "container 0: memory request, memory limit; container 1: cpu request"}
    p = pod(guaranteed("1Gi"), guaranteed("256Mi", name="log"),
            init=[container("setup", "300Mi", "300Mi")], annotations=annotations)
    result, mutation = apply(p, RAISE)
    assert memory(result, 0, "initContainers") == ("100Mi", "300Mi")
    assert memory(result, 0) == ("1Gi", "3Gi")
    assert memory(result, 1) == ("86Mi", "256Mi")
    # three containers changed; the pod needs 2000 (setup and app), log only 1977
    assert len(mutation.warnings) == 4 and mutation.warnings[-1] == backing_warning(2000)


def test_skip_skips_the_whole_pod_when_one_container_is_vpa_managed() -> None:
    annotations = {"vpaObservedContainers": "app, log", "vpaUpdates": UPDATED
                   + "container 0: memory request, memory limit; container 1: cpu request"}
    mutation = mutate_pod(pod(guaranteed("1Gi"), guaranteed("256Mi", name="log"),
                              annotations=annotations), SKIP)
    assert mutation.patch == [] and mutation.warnings == [SKIP_WARNING]


def test_both_webhook_orders_end_swap_eligible_with_the_vpa_request() -> None:
    """raiseLimit: VPA first -> 1Gi/3Gi; swapwise first -> 683Mi/2Gi, then the VPA's 1Gi and
    its proportional limit, which the reinvocation leaves. Same request, ~same limit."""
    vpa_first, _ = apply(pod(guaranteed("1Gi"), annotations=MANAGED), RAISE)
    swapwise_first, _ = apply(pod(guaranteed("2Gi")), RAISE)
    assert memory(swapwise_first) == ("683Mi", "2Gi")
    proportional = 2 * GI * GI // (683 * MI)  # what the VPA writes next
    reinvoked = copy.deepcopy(swapwise_first)
    reinvoked["spec"]["containers"][0]["resources"]["requests"]["memory"] = "1Gi"
    reinvoked["spec"]["containers"][0]["resources"]["limits"]["memory"] = str(proportional)
    reinvoked["metadata"]["annotations"].update(MANAGED)
    assert mutate_pod(reinvoked, RAISE).patch == []
    assert memory(vpa_first) == ("1Gi", "3Gi") and abs(proportional - 3 * GI) < 2 * MI


# --- the policy ----------------------------------------------------------------------------


def test_vpa_pods_in_the_policy_and_namespace_overrides() -> None:
    policy = build_policy({
        "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
        "profiles": {"p": {"vpaPods": "skip"}, "q": {}},
        "namespaces": {"team": {"vpaPods": "raiseLimit"}},
    })
    assert policy.profiles["p"].vpa_pods == "skip"
    assert policy.profiles["q"].vpa_pods == "raiseLimit"
    team = policy.resolve("p", "team")
    assert team is not None and team.vpa_pods == "raiseLimit"


@pytest.mark.parametrize("value", ["raise", "RaiseLimit", "convert", True, None])
def test_vpa_pods_invalid_values_are_refused_with_the_field_path(value: Any) -> None:
    with pytest.raises(PolicyError) as info:
        build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                      "profiles": {"p": {"vpaPods": value}}})
    assert "profiles.p.vpaPods: Input should be 'skip' or 'raiseLimit'" in str(info.value)


# --- preview and plan: a VPA in the same manifests -------------------------------------------


def manifests(mode: str = "Recreate", **vpa_spec: Any) -> list[dict[str, Any]]:
    template = pod(guaranteed("2Gi"))
    del template["metadata"]
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "web", "namespace": "team"},
                  "spec": {"replicas": 1, "template": template}}
    vpa = {"apiVersion": "autoscaling.k8s.io/v1", "kind": "VerticalPodAutoscaler",
           "metadata": {"name": "web-vpa", "namespace": "team"},
           "spec": {"targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                    "updatePolicy": {"updateMode": mode}, **vpa_spec}}
    return [deployment, vpa]


def previewed(documents: list[dict[str, Any]], fields: dict[str, Any]
              ) -> tuple[dict[str, Any], list[str]]:
    policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {"p": fields}})
    out = io.StringIO()
    results = preview(documents, policy, "p", None, out)
    return results[0][1], out.getvalue().splitlines()


def test_preview_shows_the_skip_for_a_workload_a_vpa_in_the_input_manages() -> None:
    after, warnings = previewed(manifests(), {"vpaPods": "skip"})
    assert after == manifests()[0]
    assert warnings == [f"Warning: Deployment/web: {SKIP_WARNING}"]


def test_preview_raise_limit_and_no_vpa_annotations_in_the_output() -> None:
    after, warnings = previewed(manifests(), {})
    template = after["spec"]["template"]
    assert memory(template) == ("2Gi", "6Gi")
    assert set(template["metadata"]["annotations"]) == {"swapwise.io/profile",
                                                        "swapwise.io/original"}
    assert warnings == ["Warning: Deployment/web: swapwise: app memory limit 2Gi -> 6Gi "
                        "(request 2Gi kept: a VerticalPodAutoscaler sets it)",
                        f"Warning: Deployment/web: {backing_warning(2000)}"]


@pytest.mark.parametrize("documents", [
    manifests("Off"),  # recommendations only: the VPA's webhook leaves pods alone
    manifests(resourcePolicy={"containerPolicies": [
        {"containerName": "*", "controlledResources": ["cpu"]}]}),
    [manifests()[0], {**manifests()[1], "metadata": {"name": "web-vpa", "namespace": "other"}}],
])
def test_preview_reshapes_when_no_vpa_sets_the_memory(documents: list[dict[str, Any]]) -> None:
    after, warnings = previewed(documents, {})
    assert memory(after["spec"]["template"]) == ("683Mi", "2Gi")
    assert warnings == ["Warning: Deployment/web: swapwise: app memory request 2Gi -> 683Mi "
                        "(limit 2Gi)", f"Warning: Deployment/web: {backing_warning(1999)}"]


def test_as_admitted_writes_what_the_vpa_admission_controller_writes() -> None:
    vpa = manifests(resourcePolicy={"containerPolicies": [
        {"containerName": "log", "mode": "Off"},
        {"containerName": "*", "controlledResources": ["memory"]}]})[1]
    p = pod(guaranteed("1Gi"), guaranteed("64Mi", name="log"))
    admitted = as_admitted(p, vpa)
    assert admitted["metadata"]["annotations"] == {
        "vpaObservedContainers": "app, log",
        "vpaUpdates": "Pod resources updated by web-vpa: container 0: memory request; "
                      "container 1: "}
    assert without_admission_marks(copy.deepcopy(admitted), p) == p


def test_plan_decides_as_admission_does() -> None:
    policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {"p": {"vpaPods": "skip"}}})
    node = Node(memory=16 * GI, cpu=Fraction(8), swap=32 * GI)
    [result] = plan(manifests(), policy, "p", None, node)
    assert result.pod.warnings == (SKIP_WARNING,)
    assert result.pod.skipped == "managed by a VerticalPodAutoscaler (vpaPods: skip)"
    assert not any(c.changed for c in result.pod.containers)


def test_raise_limit_on_limit_only_writes_the_request_the_api_server_would_default() -> None:
    """Offline input (preview) may have a limit only; the request is then the old limit."""
    result, _ = apply(pod(container("app", None, "128Mi", cpu=None),
                                 annotations=MANAGED), RAISE)
    assert memory(result) == ("128Mi", "384Mi")
