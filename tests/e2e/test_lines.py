"""What differs between the Kubernetes lines the suite runs on (SWAPWISE_K8S_VERSION), and
that swapwise's pods are accepted on each.

Found by running the same probes against kube-apiserver v1.34.4 and v1.37.2:

- a plain init container (no ``restartPolicy: Always``) with a memory ``resizePolicy`` of
  ``RestartContainer`` is stored by 1.34 and refused by 1.37 ("must not be set to
  'RestartContainer' for non-sidecar initContainers");
- ``RestartContainer`` in a pod with ``restartPolicy: Never`` is refused by both, worded
  differently ("when `restartPolicy` is 'Never'" on 1.34, "when pod `restartPolicy` ..." on
  1.37).

swapwise never writes ``RestartContainer`` in either place (docs/rules.md), so the same
engine output is valid on both lines; the tests below pin the API server's behaviour of the
selected line (so a line that changes it again is noticed) and store swapwise's pods there.
Everything else the e2e suite checks (defaulting of a missing request from the limit, QoS
rules of in-place resize, LimitRange and ResourceQuota order, warnings) behaved the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.cluster import DEFAULT_LINE, ControlPlane
from tests.e2e.install import Installation, container, installed, pod

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]

PLAIN = "lines-plain"  # no swapwise: the API server alone
OPTED_IN = "lines-swapwise"
RESTART = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]

# line -> (plain init container with RestartContainer: refusal text or None when stored,
#          the refusal text of RestartContainer in a restartPolicy: Never pod)
EXPECTED: dict[str, tuple[str | None, str]] = {
    "1.34": (None, "must be 'NotRequired' when `restartPolicy` is 'Never'"),
    "1.37": ("must not be set to 'RestartContainer' for non-sidecar initContainers",
             "must be 'NotRequired' when pod `restartPolicy` is 'Never'"),
}


@pytest.fixture(scope="module")
def swapwise(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installation]:
    with installed(control_plane, tmp_path_factory.mktemp("install"),
                   {"sandbox": {"swapRatio": 2}}, opted_in=(OPTED_IN, "sandbox")) as install:
        yield install


@pytest.fixture(scope="module")
def plain_namespace(control_plane: ControlPlane) -> str:
    control_plane.create_namespace(PLAIN)
    return PLAIN


def _dry_run(cp: ControlPlane, obj: dict[str, Any]) -> tuple[int, str, dict[str, Any] | None]:
    proc = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                      input=json.dumps(obj), check=False)
    return proc.returncode, proc.stderr, json.loads(proc.stdout) if proc.returncode == 0 else None


def test_the_line_is_one_the_expectations_know() -> None:
    assert DEFAULT_LINE in EXPECTED


def test_restart_container_on_a_plain_init_container(
    control_plane: ControlPlane, plain_namespace: str
) -> None:
    p = pod("init-restart", plain_namespace, container("app", memory="1Gi"))
    p["spec"]["initContainers"] = [container("setup", memory="512Mi", resizePolicy=RESTART)]
    code, stderr, got = _dry_run(control_plane, p)
    refusal = EXPECTED[DEFAULT_LINE][0]
    if refusal is None:
        assert code == 0, stderr
        assert got is not None and got["spec"]["initContainers"][0]["resizePolicy"] == RESTART
    else:
        assert code != 0 and refusal in stderr, stderr


def test_restart_container_in_a_never_pod_is_refused(
    control_plane: ControlPlane, plain_namespace: str
) -> None:
    p = pod("never-restart", plain_namespace, container("app", memory="1Gi",
                                                       resizePolicy=RESTART),
            restartPolicy="Never")
    code, stderr, _ = _dry_run(control_plane, p)
    assert code != 0 and EXPECTED[DEFAULT_LINE][1] in stderr, stderr


@pytest.mark.parametrize("restart_policy", ["Always", "Never"])
def test_swapwise_pods_with_init_containers_are_stored(
    control_plane: ControlPlane, swapwise: Installation, restart_policy: str
) -> None:
    """A plain init container, a sidecar and a container, all Guaranteed: reshaped and
    stored on this line; RestartContainer only where both lines accept it."""
    name = f"init-{restart_policy.lower()}"
    p = pod(name, OPTED_IN, container("app", memory="1536Mi"), restartPolicy=restart_policy)
    p["spec"]["initContainers"] = [
        container("setup", memory="512Mi"),
        container("proxy", memory="256Mi", restartPolicy="Always"),
    ]
    control_plane.apply(json.dumps(p))
    got = control_plane.get_json("pod", name, "-n", OPTED_IN)
    setup, proxy = got["spec"]["initContainers"]
    app = got["spec"]["containers"][0]
    assert [c["resources"]["requests"]["memory"] for c in (setup, proxy, app)] == \
        ["171Mi", "86Mi", "512Mi"]
    assert "resizePolicy" not in setup
    want = RESTART if restart_policy == "Always" else None
    assert proxy.get("resizePolicy") == want
    assert app.get("resizePolicy") == want
