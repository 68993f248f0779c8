"""The kubelet's swap rule as the webhook applies it, through the real API server.

A memory request of 0 with a limit is kept by the API server as written (only a *missing*
request is copied from the limit), and the kubelet gives such a container no swap (its share
is proportional to the request). swapwise leaves it as it is and must not steer the pod to
swap nodes; the same pod with a non-zero request below the limit gets the placement.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import PROFILE_LABEL, SWAP_LABEL, ControlPlane
from tests.e2e.install import Installation, installed, pod
from webhook.engine.pressure import MARKS

pytestmark = pytest.mark.e2e

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
NAMESPACE = "swap-rule"


@pytest.fixture(scope="module")
def swapwise(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installation]:
    with installed(control_plane, tmp_path_factory.mktemp("install"),
                   {"sandbox": {"swapRatio": 2}}, opted_in=(NAMESPACE, "sandbox")) as install:
        yield install


def app(request: str, limit: str) -> dict[str, Any]:
    return {
        "name": "app",
        "image": "registry.k8s.io/pause:3.10",
        "resources": {"requests": {"memory": request}, "limits": {"memory": limit}},
    }


@pytest.mark.parametrize(("name", "request_", "placed"), [
    ("request-zero", "0", False),
    ("request-below-limit", "256Mi", True),
])
def test_placement_only_for_a_container_that_gets_swap(
    control_plane: ControlPlane, swapwise: Installation, name: str, request_: str, placed: bool
) -> None:
    p = pod(name, NAMESPACE, app(request_, "1Gi"))
    out = control_plane.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(p)
    )
    got = json.loads(out.stdout)
    resources = got["spec"]["containers"][0]["resources"]
    assert resources["requests"]["memory"] == request_  # never rewritten: request < limit
    assert resources["limits"]["memory"] == "1Gi"
    affinity = got["spec"].get("affinity", {}).get("nodeAffinity", {}).get(REQUIRED)
    annotations = got["metadata"].get("annotations") or {}
    if placed:
        # already swap-eligible, unchanged: the swap label and the pressure entries, no swap
        # backing (docs/rules.md)
        expressions = [{"key": SWAP_LABEL, "operator": "In", "values": ["true"]},
                       *(mark.expression() for mark in MARKS)]
        assert affinity == {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        assert annotations[PROFILE_LABEL] == "sandbox"
    else:
        assert affinity is None
        assert PROFILE_LABEL not in annotations  # no patch at all
    assert got["status"]["qosClass"] == "Burstable"
