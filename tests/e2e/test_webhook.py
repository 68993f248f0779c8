"""swapwise end to end: kube-apiserver calls it through the chart-rendered configuration.

Every test goes through the real admission chain (defaulting, mutating webhooks with
reinvocation, LimitRanger, ResourceQuota, validation) and, where placement matters, the
real kube-scheduler binding pods to fake nodes.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import PROFILE_LABEL, SWAP_LABEL, ControlPlane, wait_for_mutation
from tests.e2e.install import Installation, container, manifest, pod
from webhook import certs
from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.pressure import MARKS

pytestmark = [pytest.mark.e2e, pytest.mark.smoke]

PROFILES = {
    "sandbox": {"swapRatio": 2},
    "limited": {"swapRatio": 2, "maxLimitRequestRatio": 2},
}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
SWAP_EXPR = {"key": SWAP_LABEL, "operator": "In", "values": ["true"]}
NO_MARKS = [mark.expression() for mark in MARKS]


def backed(need: int) -> dict[str, Any]:
    """The swap-backing expression of a pod that needs ``need`` per mille."""
    return {"key": PERMILLE_LABEL, "operator": "Gt", "values": [str(need - 1)]}


@pytest.fixture(scope="module")
def swapwise(
    control_plane: ControlPlane,
    standard_nodes: dict[str, list[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installation]:
    install = Installation(control_plane, tmp_path_factory.mktemp("install"), PROFILES)
    install.upgrade()
    install.start_server()
    control_plane.create_namespace("sandboxes", {PROFILE_LABEL: "sandbox"})
    wait_for_mutation(control_plane, "sandboxes")
    yield install
    install.stop_server()
    install.helm("uninstall", "swapwise", "--namespace", "swapwise", check=False)


def memory(p: dict[str, Any], index: int = 0, field: str = "containers") -> dict[str, str]:
    resources = p["spec"][field][index]["resources"]
    return {"request": resources["requests"]["memory"], "limit": resources["limits"]["memory"]}


def stored(cp: ControlPlane, name: str, namespace: str) -> dict[str, Any]:
    found: dict[str, Any] = cp.get_json("pod", name, "-n", namespace)
    return found


def bound_node(cp: ControlPlane, name: str, namespace: str) -> str:
    return cp.wait_for(
        lambda: stored(cp, name, namespace)["spec"].get("nodeName"),
        what=f"pod {namespace}/{name} to be scheduled",
    )


# 1 -------------------------------------------------------------------------------------


def test_dry_run_server_shows_the_reshaped_pod_and_warnings(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    p = pod("preview", "sandboxes", container(memory="2Gi"))
    out = control_plane.kubectl(
        "apply", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(p)
    )
    result = json.loads(out.stdout)
    assert memory(result) == {"request": "683Mi", "limit": "2Gi"}
    assert result["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "100m"
    assert result["metadata"]["annotations"][PROFILE_LABEL] == "sandbox"
    terms = result["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, backed(1999)]}]
    assert "Warning: swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)" in out.stderr
    assert ("Warning: swapwise: needs nodes whose swap is >= 1999\u2030 of their RAM (node "
            "label swapwise.io/swap-permille, from the node agent)") in out.stderr
    missing = control_plane.kubectl("get", "pod", "preview", "-n", "sandboxes", check=False)
    assert missing.returncode != 0 and "NotFound" in missing.stderr


# 2 -------------------------------------------------------------------------------------


def test_created_pod_is_stored_mutated_and_bound_to_a_swap_node(
    control_plane: ControlPlane, swapwise: Installation, standard_nodes: dict[str, list[str]]
) -> None:
    control_plane.apply(json.dumps(pod("created", "sandboxes", container(memory="3Gi"))))
    p = stored(control_plane, "created", "sandboxes")
    assert memory(p) == {"request": "1Gi", "limit": "3Gi"}
    assert json.loads(p["metadata"]["annotations"]["swapwise.io/original"]) == {
        "app": {"request": "3Gi", "limit": "3Gi"}
    }
    assert p["spec"]["containers"][0]["resizePolicy"] == [
        {"resourceName": "memory", "restartPolicy": "RestartContainer"}
    ]
    assert p["status"]["qosClass"] == "Burstable"
    assert bound_node(control_plane, "created", "sandboxes") in standard_nodes["swap"]


# 3 -------------------------------------------------------------------------------------


def test_deployment_pods_created_by_the_controller_are_reshaped_and_placed(
    control_plane: ControlPlane, swapwise: Installation, standard_nodes: dict[str, list[str]]
) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "workers", "namespace": "sandboxes"},
        "spec": {
            "replicas": 10,
            "selector": {"matchLabels": {"app": "workers"}},
            "template": {
                "metadata": {"labels": {"app": "workers"}},
                "spec": {"containers": [container(memory="1Gi")]},
            },
        },
    }
    control_plane.apply(json.dumps(deployment))

    def all_bound() -> list[dict[str, Any]] | None:
        pods = control_plane.get_json("pods", "-n", "sandboxes", "-l", "app=workers")["items"]
        done = len(pods) == 10 and all(p["spec"].get("nodeName") for p in pods)
        return pods if done else None

    pods = control_plane.wait_for(all_bound, 90, what="10 deployment pods bound")
    for p in pods:
        assert memory(p) == {"request": "342Mi", "limit": "1Gi"}
        assert p["spec"]["nodeName"] in standard_nodes["swap"]
        assert p["metadata"]["annotations"][PROFILE_LABEL] == "sandbox"


# 4 -------------------------------------------------------------------------------------


def test_untouched_namespaces_critical_and_opted_out_pods(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    control_plane.create_namespace("plain")
    cases = [
        pod("unlabelled-ns", "plain", container()),
        pod("critical", "sandboxes", container(), priorityClassName="system-cluster-critical"),
        pod("node-critical", "sandboxes", container(), priorityClassName="system-node-critical"),
    ]
    opted_label = pod("opt-label", "sandboxes", container())
    opted_label["metadata"]["labels"]["swapwise.io/skip"] = "true"
    opted_annotation = pod("opt-annotation", "sandboxes", container())
    opted_annotation["metadata"]["annotations"] = {"swapwise.io/skip": "true"}
    control_plane.apply(manifest(*cases, opted_label, opted_annotation))
    for name, namespace in [
        ("unlabelled-ns", "plain"),
        ("critical", "sandboxes"),
        ("node-critical", "sandboxes"),
        ("opt-label", "sandboxes"),
        ("opt-annotation", "sandboxes"),
    ]:
        p = stored(control_plane, name, namespace)
        assert memory(p) == {"request": "2Gi", "limit": "2Gi"}, name
        assert PROFILE_LABEL not in (p["metadata"].get("annotations") or {}), name
        assert "affinity" not in p["spec"], name
        assert p["status"]["qosClass"] == "Guaranteed"


# 5 -------------------------------------------------------------------------------------


def test_job_pods_never_get_a_resize_policy(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "batch", "namespace": "sandboxes"},
        "spec": {
            "template": {
                "spec": {"restartPolicy": "Never", "containers": [container(memory="1536Mi")]}
            }
        },
    }
    control_plane.apply(json.dumps(job))
    pods = control_plane.wait_for(
        lambda: (
            control_plane.get_json(
                "pods", "-n", "sandboxes", "-l", "batch.kubernetes.io/job-name=batch"
            )["items"]
            or None
        ),
        what="the job's pod",
    )
    assert memory(pods[0]) == {"request": "512Mi", "limit": "1536Mi"}
    assert "resizePolicy" not in pods[0]["spec"]["containers"][0]


def test_sidecars_init_containers_and_multi_container_pods_are_accepted(
    control_plane: ControlPlane, swapwise: Installation, standard_nodes: dict[str, list[str]]
) -> None:
    p = pod(
        "multi",
        "sandboxes",
        container("main", memory="2Gi"),
        container("helper", memory="1Gi", guaranteed=False),
    )
    p["spec"]["containers"][1]["resources"]["requests"] = {"memory": "100Mi", "cpu": "100m"}
    p["spec"]["initContainers"] = [
        container("setup", memory="512Mi"),
        container("proxy", memory="256Mi", restartPolicy="Always"),
    ]
    control_plane.apply(json.dumps(p))
    got = stored(control_plane, "multi", "sandboxes")
    assert memory(got, 0) == {"request": "683Mi", "limit": "2Gi"}
    assert memory(got, 1) == {"request": "100Mi", "limit": "1Gi"}
    assert memory(got, 0, "initContainers") == {"request": "171Mi", "limit": "512Mi"}
    assert memory(got, 1, "initContainers") == {"request": "86Mi", "limit": "256Mi"}
    setup, proxy = got["spec"]["initContainers"]
    assert "resizePolicy" not in setup
    assert proxy["resizePolicy"][0]["restartPolicy"] == "RestartContainer"
    assert "resizePolicy" not in got["spec"]["containers"][1]
    assert bound_node(control_plane, "multi", "sandboxes") in standard_nodes["swap"]


def test_pod_level_resources_are_accepted(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    p = pod(
        "pod-level",
        "sandboxes",
        container(memory="1Gi"),
        resources={
            "requests": {"memory": "2Gi", "cpu": "200m"},
            "limits": {"memory": "2Gi", "cpu": "200m"},
        },
    )
    control_plane.apply(json.dumps(p))
    got = stored(control_plane, "pod-level", "sandboxes")
    assert memory(got) == {"request": "342Mi", "limit": "1Gi"}
    assert got["spec"]["resources"] == p["spec"]["resources"]
    # Pod-level request == limit keeps the pod Guaranteed: no swap, so no placement.
    assert got["status"]["qosClass"] == "Guaranteed"
    assert "affinity" not in got["spec"]


def test_existing_node_affinity_gets_the_swap_expression_in_every_term(
    control_plane: ControlPlane, swapwise: Installation, standard_nodes: dict[str, list[str]]
) -> None:
    terms = [
        {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/hostname",
                    "operator": "In",
                    "values": [standard_nodes["plain"][0]],
                }
            ]
        },
        {
            "matchExpressions": [
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}
            ]
        },
    ]
    p = pod(
        "affine",
        "sandboxes",
        container(),
        affinity={"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}},
    )
    control_plane.apply(json.dumps(p))
    got = stored(control_plane, "affine", "sandboxes")
    for term in got["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]:
        assert term["matchExpressions"][-4:] == [SWAP_EXPR, *NO_MARKS, backed(1999)]
    # The plain node is still named by the first term, but can no longer be chosen.
    assert bound_node(control_plane, "affine", "sandboxes") in standard_nodes["swap"]


def test_limit_range_and_resource_quota(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    limit_range = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": "ratio"},
        "spec": {"limits": [{"type": "Container", "maxLimitRequestRatio": {"memory": "2"}}]},
    }
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "mem"},
        "spec": {"hard": {"requests.memory": "4Gi", "limits.memory": "8Gi"}},
    }
    for namespace, profile in (("limited", "limited"), ("unlimited", "sandbox")):
        control_plane.create_namespace(namespace, {PROFILE_LABEL: profile})
        wait_for_mutation(control_plane, namespace)
        control_plane.apply(manifest(limit_range, quota), "-n", namespace)

    # maxLimitRequestRatio: 2 in the profile keeps the patch within the LimitRange.
    control_plane.apply(json.dumps(pod("fits", "limited", container(memory="2Gi"))))
    assert memory(stored(control_plane, "fits", "limited")) == {"request": "1Gi", "limit": "2Gi"}
    control_plane.wait_for(
        lambda: (
            control_plane.get_json("resourcequota", "mem", "-n", "limited")["status"]
            .get("used", {})
            .get("requests.memory")
            == "1Gi"
        ),
        what="quota usage to count the mutated request",
    )

    # Without it (ratio 3 > 2) LimitRanger, which runs after webhooks, refuses the pod:
    # the reason the profile knob exists.
    refused = control_plane.kubectl(
        "apply", "-f", "-", input=json.dumps(pod("too-far", "unlimited", container())), check=False
    )
    assert refused.returncode != 0
    assert "memory max limit to request ratio per Container is 2" in refused.stderr


# 6 -------------------------------------------------------------------------------------


class _Injector(BaseHTTPRequestHandler):
    """A second mutating webhook, like a service-mesh injector: adds a Guaranteed sidecar."""

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        names = [c["name"] for c in request["object"]["spec"]["containers"]]
        if "injected" not in names:
            patch = [
                {
                    "op": "add",
                    "path": "/spec/containers/-",
                    "value": container("injected", memory="256Mi", cpu="50m"),
                }
            ]
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        body = json.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def injector(control_plane: ControlPlane, tmp_path: Path) -> Iterator[None]:
    files = certs.write(tmp_path, *certs.generate(["localhost"], ["127.0.0.1"]))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Injector)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "zz-injector"},  # sorts after "swapwise": called second
        "webhooks": [
            {
                "name": "injector.example.com",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{server.server_port}/inject",
                    "caBundle": base64.b64encode(files.ca.read_bytes()).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"inject": "true"}},
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
            }
        ],
    }
    control_plane.apply(json.dumps(config))
    yield
    control_plane.kubectl("delete", "mutatingwebhookconfiguration", "zz-injector")
    server.shutdown()


def test_reinvocation_with_a_second_webhook_gives_a_stable_correct_pod(
    control_plane: ControlPlane, swapwise: Installation, injector: None
) -> None:
    control_plane.create_namespace("meshed", {PROFILE_LABEL: "sandbox", "inject": "true"})

    def injected_and_mutated() -> bool:
        p = pod("probe", "meshed", container())
        out = control_plane.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(p)
        ).stdout
        got = json.loads(out)
        names = [c["name"] for c in got["spec"]["containers"]]
        return "injected" in names and PROFILE_LABEL in got["metadata"].get("annotations", {})

    control_plane.wait_for(injected_and_mutated, what="both webhooks active")
    control_plane.apply(json.dumps(pod("meshed", "meshed", container())))
    got = stored(control_plane, "meshed", "meshed")
    app, sidecar = got["spec"]["containers"]
    assert sidecar["name"] == "injected"
    # swapwise was reinvoked after the injector and reshaped its sidecar too.
    assert memory(got, 0) == {"request": "683Mi", "limit": "2Gi"}
    assert memory(got, 1) == {"request": "86Mi", "limit": "256Mi"}
    assert sidecar["resizePolicy"] == app["resizePolicy"]
    assert json.loads(got["metadata"]["annotations"]["swapwise.io/original"]) == {
        "app": {"request": "2Gi", "limit": "2Gi"},
        "injected": {"request": "256Mi", "limit": "256Mi"},
    }
    terms = got["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]
    # placed once; the second pass's need (injected: 1977) is below the first's, kept
    assert terms == [{"matchExpressions": [SWAP_EXPR, *NO_MARKS, backed(1999)]}]


# 7 -------------------------------------------------------------------------------------


def test_swapwise_down_ignore_admits_unchanged_and_fail_refuses(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    swapwise.stop_server()
    try:
        control_plane.apply(json.dumps(pod("while-down", "sandboxes", container())))
        p = stored(control_plane, "while-down", "sandboxes")
        assert memory(p) == {"request": "2Gi", "limit": "2Gi"}
        assert PROFILE_LABEL not in (p["metadata"].get("annotations") or {})

        swapwise.upgrade(webhook={"failurePolicy": "Fail"})
        swapwise.wait_for_failure_policy("Fail")

        def refused() -> str | None:
            out = control_plane.kubectl(
                "create",
                "--dry-run=server",
                "-f",
                "-",
                check=False,
                input=json.dumps(pod("refused", "sandboxes", container())),
            )
            return out.stderr if out.returncode != 0 else None

        message = control_plane.wait_for(refused, what="pods refused with failurePolicy Fail")
        assert 'failed calling webhook "sandbox.swapwise.io"' in message
        assert "connection refused" in message
    finally:
        swapwise.upgrade(webhook={"failurePolicy": "Ignore"})
        swapwise.wait_for_failure_policy("Ignore")
        swapwise.start_server()
        wait_for_mutation(control_plane, "sandboxes")


def test_helm_upgrade_keeps_the_self_signed_ca(
    control_plane: ControlPlane, swapwise: Installation
) -> None:
    before = swapwise.tls_secret()
    bundles = {h["clientConfig"]["caBundle"] for h in swapwise.webhook_configuration()["webhooks"]}
    swapwise.upgrade(
        policy={"profiles": {"default": None, **PROFILES, "extra": {"requestRatio": 0.5}}}
    )
    try:
        hooks = swapwise.webhook_configuration()["webhooks"]
        assert sorted(h["name"] for h in hooks) == [
            "extra.swapwise.io",
            "limited.swapwise.io",
            "sandbox.swapwise.io",
        ]
        assert {h["clientConfig"]["caBundle"] for h in hooks} == bundles
        assert swapwise.tls_secret() == before
        assert base64.b64decode(bundles.pop()) == before["ca.crt"]
    finally:
        swapwise.upgrade(policy={"profiles": {"default": None, **PROFILES}})


# 8 -------------------------------------------------------------------------------------


def test_density_headline(control_plane: ControlPlane, swapwise: Installation) -> None:
    """The public Python-sandbox shape (2Gi guaranteed, 100m) on one 28Gi / 8 CPU swap node."""
    control_plane.create_node(
        "density-1",
        memory="28Gi",
        cpu="8",
        labels={SWAP_LABEL: "true", "density": "true", PERMILLE_LABEL: "2000"},  # 56Gi / 28Gi
        swap_capacity=56 * 1024**3,
    )
    control_plane.kubectl("taint", "node", "density-1", "density=true:NoSchedule")
    total = 60
    sandbox = {
        "nodeSelector": {"kubernetes.io/hostname": "density-1"},
        "tolerations": [{"key": "density", "operator": "Exists", "effect": "NoSchedule"}],
    }
    counts = {}
    for namespace, labels in (("density-off", {}), ("density-on", {PROFILE_LABEL: "sandbox"})):
        control_plane.create_namespace(namespace, labels)
        if labels:
            wait_for_mutation(control_plane, namespace)
        pods = [
            pod(f"sandbox-{i}", namespace, container(memory="2Gi", cpu="100m"), **sandbox)
            for i in range(total)
        ]
        counts[namespace] = control_plane.density(namespace, manifest(*pods), total)
    without, with_swapwise = counts["density-off"], counts["density-on"]
    print(
        f"\ndensity on a 28Gi/8-CPU swap node: {without} pods without swapwise, "
        f"{with_swapwise} with swapRatio 2 ({with_swapwise / without:.2f}x)"
    )
    assert without == 14  # 28Gi / 2Gi
    assert with_swapwise / without >= 2.9
