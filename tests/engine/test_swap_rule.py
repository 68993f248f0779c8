"""The kubelet's LimitedSwap rule (docs/rules.md), asked by the webhook's placement and by ``plan``.

One table, three readers: the rule on the pod as submitted (``PodView.swap_eligible``), the
webhook (placement is added exactly when a container of the resulting pod gets swap) and
``plan`` (its per-container ``swap_eligible`` and swap share). They used to be two copies that
disagreed on a memory request of 0: the kubelet's swap limit is proportional to the request,
so such a container gets ``memory.swap.max`` 0, and neither the webhook nor plan may count it.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from testkit.engine_check import apply
from webhook.analysis.planner import Node, plan_pod
from webhook.engine import reshape
from webhook.engine.pod import PodView, gets_swap
from webhook.policy import default_policy

GI = 1024**3
DEFAULT = default_policy().profiles["default"]  # swapRatio 2, placement required
NODE = Node(memory=16 * GI, swap=32 * GI, cpu=Fraction(8))


def c(name: str = "app", request: str | None = None, limit: str | None = None,
      cpu: str | None = None, **extra: Any) -> dict[str, Any]:
    """A container; ``cpu`` goes into both requests and limits."""
    resources: dict[str, Any] = {}
    requests = {k: v for k, v in (("memory", request), ("cpu", cpu)) if v is not None}
    limits = {k: v for k, v in (("memory", limit), ("cpu", cpu)) if v is not None}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return {"name": name, "image": "python", "resources": resources, **extra}


def sidecar(name: str, request: str | None = None, limit: str | None = None) -> dict[str, Any]:
    return c(name, request, limit, restartPolicy="Always")


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = list(init)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": body}


BURSTABLE_POD_LEVEL = {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}
GUARANTEED_POD_LEVEL = {"requests": {"memory": "2Gi", "cpu": "200m"},
                        "limits": {"memory": "2Gi", "cpu": "200m"}}

# id: (pod, swap per container as submitted, after swapwise; initContainers first)
CASES: dict[str, tuple[dict[str, Any], list[bool], list[bool]]] = {
    # The kubelet's share is request / capacity * swap: 0 for a request of 0. swapwise leaves
    # request < limit alone, so the container stays without swap, and gets no placement.
    "request 0, limit 1Gi": (pod(c(request="0", limit="1Gi")), [False], [False]),
    "request 0, no limit": (pod(c(request="0", cpu="100m")), [False], [False]),
    "request only": (pod(c(request="512Mi")), [True], [True]),
    "request < limit": (pod(c(request="256Mi", limit="1Gi")), [True], [True]),
    # The API server copies the limit into the request: request == limit, no swap, until
    # swapwise lowers the request to 342Mi.
    "limit only": (pod(c(limit="1Gi")), [False], [True]),
    "guaranteed": (pod(c(request="1Gi", limit="1Gi", cpu="100m")), [False], [True]),
    "no memory at all": (pod(c(cpu="100m")), [False], [False]),
    "best effort": (pod(c()), [False], [False]),
    # Pod-level resources decide the QoS class: request == limit there keeps the pod
    # Guaranteed, whatever swapwise does to the containers.
    "pod-level guaranteed": (
        pod(c(request="1Gi", limit="1Gi", cpu="100m"), resources=GUARANTEED_POD_LEVEL),
        [False], [False],
    ),
    "pod-level burstable": (
        pod(c(request="256Mi", limit="1Gi"), resources=BURSTABLE_POD_LEVEL), [True], [True],
    ),
    "pod-level burstable, container request 0": (
        pod(c(request="0", limit="1Gi"), resources=BURSTABLE_POD_LEVEL), [False], [False],
    ),
    "sidecar swaps, app guaranteed": (
        pod(c(request="1Gi", limit="1Gi", cpu="100m"), init=(sidecar("proxy", "128Mi", "256Mi"),)),
        [True, False], [True, True],
    ),
    "sidecar request 0": (
        pod(c(cpu="100m"), init=(sidecar("proxy", "0", "256Mi"),)), [False, False], [False, False],
    ),
    "sidecar limit only": (
        pod(c(cpu="100m"), init=(sidecar("proxy", limit="256Mi"),)), [False, False], [True, False],
    ),
    # A plain init container gets swap while it runs, like any container of the pod.
    "init container swaps": (
        pod(c(cpu="100m"), init=(c("setup", "256Mi", "1Gi"),)), [True, False], [True, False],
    ),
    "init container request 0": (
        pod(c(cpu="100m"), init=(c("setup", "0", "1Gi"),)), [False, False], [False, False],
    ),
    # Critical pods never get swap; swapwise leaves them alone.
    "critical": (
        pod(c(request="256Mi", limit="1Gi"), priorityClassName="system-node-critical"),
        [False], [False],
    ),
}

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@pytest.mark.parametrize(("submitted", "before", "after"), CASES.values(), ids=CASES.keys())
def test_one_rule_for_the_webhook_and_plan(
    submitted: dict[str, Any], before: list[bool], after: list[bool]
) -> None:
    assert list(PodView.parse(submitted).swap_eligible()) == before
    result, mutation = apply(submitted, DEFAULT)
    assert list(PodView.parse(result).swap_eligible()) == after
    # The webhook steers the pod to swap nodes exactly when a container will get swap.
    placed = REQUIRED in result["spec"].get("affinity", {}).get("nodeAffinity", {})
    assert placed == any(after)
    if not mutation.changes and not any(after):
        assert mutation.patch == []  # nothing to do: no annotation either
    plan = plan_pod(reshape(submitted, DEFAULT), NODE)
    assert [container.swap_eligible for container in plan.containers] == after
    for container in plan.containers:
        assert (container.swap_share > 0) == container.swap_eligible


def test_request_0_gets_no_share_in_plan() -> None:
    plan = plan_pod(reshape(pod(c(request="0", limit="1Gi")), DEFAULT), NODE)
    (app,) = plan.containers
    assert (app.request_after, app.limit_after) == (0, GI)
    assert not app.swap_eligible and app.swap_share == 0 and app.fits is None
    assert plan.needed_swap_ratio is None


@pytest.mark.parametrize(("qos", "critical", "memory_request", "limit", "swaps"), [
    ("Burstable", False, Fraction(1), Fraction(2), True),
    ("Burstable", False, Fraction(1), None, True),
    ("Burstable", False, Fraction(0), Fraction(2), False),
    ("Burstable", False, Fraction(0), None, False),
    ("Burstable", False, Fraction(2), Fraction(2), False),
    ("Burstable", False, None, None, False),
    ("Burstable", True, Fraction(1), Fraction(2), False),
    ("Guaranteed", False, Fraction(1), Fraction(2), False),
    ("BestEffort", False, None, None, False),
])
def test_gets_swap(
    qos: str, critical: bool, memory_request: Fraction | None, limit: Fraction | None,
    swaps: bool,
) -> None:
    assert gets_swap(qos, critical, memory_request, limit) is swaps
