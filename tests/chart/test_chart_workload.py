"""Deployment, Service, ServiceAccount, PodDisruptionBudget, ServiceMonitor, NOTES."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from chartlib import NAMESPACE, RELEASE, REPO, Chart, all_of, container, kinds, one

FULL = f"{RELEASE}-swapwise"
SELECTOR = {
    "app.kubernetes.io/name": "swapwise",
    "app.kubernetes.io/instance": RELEASE,
    "app.kubernetes.io/component": "webhook",
}


def webhook_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects of the webhook; the node agent's, on by default, have their own tests
    (test_chart_node_agent.py)."""
    return [o for o in objs
            if o["metadata"]["labels"].get("app.kubernetes.io/component") != "node-agent"]


@pytest.fixture(scope="module")
def objs(chart: Chart) -> list[dict[str, Any]]:
    return webhook_objects(chart.render())


def _pod_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(one(objs, "Deployment")["spec"]["template"]["spec"])


def test_default_objects(objs: list[dict[str, Any]]) -> None:
    assert sorted(kinds(objs)) == sorted(
        [
            "ConfigMap",
            "Deployment",
            "MutatingWebhookConfiguration",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "ServiceAccount",
        ]
    )
    for obj in objs:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "swapwise-0.1.0"
        if obj["kind"] != "MutatingWebhookConfiguration":
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_deployment_safe_defaults(objs: list[dict[str, Any]]) -> None:
    dep = one(objs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    spec = _pod_spec(objs)
    assert spec["automountServiceAccountToken"] is False
    assert spec["serviceAccountName"] == FULL
    assert "priorityClassName" not in spec
    (spread,) = spec["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"] == {"matchLabels": SELECTOR}
    (anti,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert anti["podAffinityTerm"]["labelSelector"] == {"matchLabels": SELECTOR}
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["podAntiAffinity"]
    )


def test_restricted_security_context(objs: list[dict[str, Any]]) -> None:
    pod_sc = _pod_spec(objs)["securityContext"]
    assert pod_sc["runAsNonRoot"] is True
    assert pod_sc["runAsUser"] == 65532 and pod_sc["runAsGroup"] == 65532
    assert pod_sc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(objs)["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc or sc["privileged"] is False


def test_container_args_mounts_probes(objs: list[dict[str, Any]]) -> None:
    c = container(objs)
    assert c["image"] == "swapwise:0.1.0"
    assert c["args"] == [
        "--policy",
        "/etc/swapwise/policy/policy.yaml",
        "--cert-dir",
        "/etc/swapwise/tls",
        "--host",
        "0.0.0.0",
        "--port",
        "8443",
        "--drain-seconds",
        "12",
    ]
    assert c["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["policy"]["mountPath"] == "/etc/swapwise/policy"
    assert mounts["tls"]["mountPath"] == "/etc/swapwise/tls"
    volumes = {v["name"]: v for v in _pod_spec(objs)["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == f"{FULL}-policy"
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "https", "scheme": "HTTPS"}


def test_graceful_rollout(objs: list[dict[str, Any]]) -> None:
    c = container(objs)
    assert c["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    assert _pod_spec(objs)["terminationGracePeriodSeconds"] > 5
    res = c["resources"]
    assert set(res["requests"]) == {"cpu", "memory"}
    assert "memory" in res["limits"]


def test_image_matches_dockerfile_defaults(objs: list[dict[str, Any]]) -> None:
    """The chart passes the arguments the image's CMD defaults to, plus the drain its
    probes call for."""
    text = (REPO / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", text, re.M)
    assert cmd, "Dockerfile has no exec-form CMD"
    args = container(objs)["args"]
    assert json.loads(cmd.group(1)) == args[:-2] and args[-2] == "--drain-seconds"
    assert re.search(r'^ENTRYPOINT \["swapwise", "serve"\]$', text, re.M)
    assert "USER 65532:65532" in text


def test_image_values(chart: Chart) -> None:
    c = container(
        chart.render(
            {
                "image": {
                    "repository": "reg.example/swapwise",
                    "tag": "1.2.3",
                    "pullPolicy": "Always",
                }
            }
        )
    )
    assert c["image"] == "reg.example/swapwise:1.2.3"
    assert c["imagePullPolicy"] == "Always"
    digest = "sha256:" + "a" * 64
    c = container(chart.render({"image": {"digest": digest}}))
    assert c["image"] == f"swapwise@{digest}"


def test_service(objs: list[dict[str, Any]]) -> None:
    svc = one(objs, "Service")
    assert svc["metadata"]["name"] == FULL
    assert svc["spec"]["selector"] == SELECTOR
    assert svc["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "https", "protocol": "TCP"}
    ]


def test_service_account_has_no_token(objs: list[dict[str, Any]]) -> None:
    sa = one(objs, "ServiceAccount")
    assert sa["metadata"]["name"] == FULL
    assert sa["automountServiceAccountToken"] is False


def test_existing_service_account(chart: Chart) -> None:
    objs = webhook_objects(chart.render({"serviceAccount": {"create": False, "name": "mine"}}))
    assert not all_of(objs, "ServiceAccount")
    assert _pod_spec(objs)["serviceAccountName"] == "mine"


def test_pod_disruption_budget(objs: list[dict[str, Any]], chart: Chart) -> None:
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == {"matchLabels": SELECTOR}
    # A single replica with minAvailable 1 would block every drain: no PDB then.
    assert not all_of(chart.render({"replicaCount": 1}), "PodDisruptionBudget")
    assert not all_of(
        chart.render({"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget"
    )


def test_scheduling_knobs(chart: Chart) -> None:
    node_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                        ]
                    }
                ]
            }
        }
    }
    objs = chart.render(
        {
            "priorityClassName": "system-cluster-critical",
            "affinity": node_affinity,
            "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            "nodeSelector": {"role": "infra"},
        }
    )
    spec = _pod_spec(objs)
    assert spec["priorityClassName"] == "system-cluster-critical"
    assert spec["affinity"]["nodeAffinity"] == node_affinity["nodeAffinity"]
    assert "podAntiAffinity" in spec["affinity"]  # merged, not replaced
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert spec["nodeSelector"] == {"role": "infra"}

    bare = _pod_spec(chart.render({"topologySpread": False, "podAntiAffinity": False}))
    assert "topologySpreadConstraints" not in bare
    assert "affinity" not in bare


def test_service_monitor(chart: Chart, objs: list[dict[str, Any]]) -> None:
    assert not all_of(objs, "ServiceMonitor")
    values = {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}}
    sm = one(chart.render(values), "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["selector"] == {"matchLabels": SELECTOR}
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] == "https"
    assert endpoint["scheme"] == "https"
    assert endpoint["path"] == "/metrics"
    assert endpoint["tlsConfig"] == {
        "serverName": f"{FULL}.{NAMESPACE}.svc",
        "ca": {"secret": {"name": f"{FULL}-tls", "key": "ca.crt"}},
    }


def test_notes(chart: Chart) -> None:
    values = {"policy": {"profiles": {"default": None, "sandbox": {}, "batch": {}}}}
    notes = chart.notes(values)
    assert "kubectl label namespace <namespace> swapwise.io/profile=batch" in notes
    assert "--dry-run=server" in notes
    assert "/mutate/sandbox" in notes
    assert f"rollout status deployment/{FULL}" in notes
    url_notes = chart.notes({"webhook": {"url": "https://127.0.0.1:8443"}})
    assert "OUTSIDE the cluster" in url_notes


def test_startup_probe_guards_slow_starts(objs: list[dict[str, Any]]) -> None:
    """Liveness waits for the startup probe: a slow node's Python start is not a crash."""
    probe = container(objs)["startupProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 60


def test_host_network_mode(chart: Chart) -> None:
    """hostNetwork: the server binds the node's port, the Service targets it by name, and
    a rollout replaces replicas in place (a surge pod could not share the port)."""
    objs = chart.render({"hostNetwork": {"enabled": True, "port": 10299}})
    dep = one(objs, "Deployment")
    spec = _pod_spec(objs)
    assert spec["hostNetwork"] is True
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    c = container(objs)
    assert c["ports"] == [{"name": "https", "containerPort": 10299, "protocol": "TCP"}]
    assert c["args"][c["args"].index("--port") + 1] == "10299"
    assert one(objs, "Service")["spec"]["ports"][0]["targetPort"] == "https"
    default = _pod_spec(chart.render())
    assert "hostNetwork" not in default and "dnsPolicy" not in default


def test_host_network_port_validated(chart: Chart) -> None:
    assert "port" in chart.error({"hostNetwork": {"enabled": True, "port": 70000}})


def _drain(objs: list[dict[str, Any]]) -> str:
    args = container(objs)["args"]
    return str(args[args.index("--drain-seconds") + 1])


def test_drain_outlasts_the_readiness_probe(chart: Chart) -> None:
    """By default the server serves past the time a failing readiness probe takes to
    withdraw its endpoint; an explicit drainSeconds wins."""
    assert _drain(chart.render()) == "12"  # 5 s x 2 + 2
    probe = {"readinessProbe": {"httpGet": {"path": "/readyz", "port": "https"},
                                "periodSeconds": 2, "failureThreshold": 1}}
    assert _drain(chart.render(probe)) == "4"
    assert _drain(chart.render({"drainSeconds": 3})) == "3"


def test_grace_period_must_cover_prestop_and_drain(chart: Chart) -> None:
    message = chart.error({"terminationGracePeriodSeconds": 20})
    assert "terminationGracePeriodSeconds (20) must be at least" in message
    assert "= 27" in message
    assert _drain(chart.render({"terminationGracePeriodSeconds": 27})) == "12"
