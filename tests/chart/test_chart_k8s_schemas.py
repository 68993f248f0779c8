"""Every rendered manifest validates against the Kubernetes 1.34 schemas (strict).

cert-manager and prometheus-operator kinds have no schema in kubernetes-validate; their
shapes are asserted in test_chart_certs.py and test_chart_workload.py.
"""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from chartlib import Chart, is_crd_kind

VALIDATE_VERSION = "1.34.0"

COMBOS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "three-profiles-fail-closed": {
        "policy": {
            "profiles": {
                "default": None,
                "sandbox": {"swapRatio": 2},
                "batch": {},
                "ml": {"requestRatio": 0.5},
            },
            "namespaces": {"team-a": {"requestRatio": 0.25}},
        },
        "webhook": {
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "excludeNamespaces": ["monitoring"],
        },
    },
    "certManager-servicemonitor": {
        "certs": {"mode": "certManager"},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "monitoring-audit": {
        "metrics": {"prometheusRule": {"enabled": True},
                    "grafanaDashboard": {"enabled": True, "namespace": "monitoring"}},
        "audit": {"rbac": {"create": True}},
    },
    "secret": {"certs": {"mode": "secret", "secretName": "tls", "caBundle": "Zm9v"}},
    "url": {"webhook": {"url": "https://127.0.0.1:8443"}},
    "node-agent-kubelet-taint": {
        "nodeAgent": {
            "swapBehaviorSource": "kubelet",
            "kubelet": {"caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n"
                                    "-----END CERTIFICATE-----\n"},
            "pressureMarks": {"markWith": "taint", "markWindow": 20, "clearWindow": 300},
            "kubepodsPressure": False,
            "priorityClassName": "",
            "nodeSelector": {"pool": "swap"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "pool", "operator": "In", "values": ["swap"]}]}]}}},
            "podAnnotations": {"a": "b"},
            "image": {"repository": "r/agent", "tag": "1"},
        },
    },
    "node-agent-off": {"nodeAgent": {"enabled": False}},
    "one-replica-knobs": {
        "replicaCount": 1,
        "priorityClassName": "system-cluster-critical",
        "serviceAccount": {"create": False, "name": "x"},
        "extraArgs": ["--log-level", "debug"],
        "env": [{"name": "A", "value": "b"}],
        "podAnnotations": {"a": "b"},
        "podLabels": {"c": "d"},
        "tolerations": [{"key": "k", "operator": "Exists"}],
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "imagePullSecrets": [{"name": "pull"}],
        "topologySpread": False,
        "podAntiAffinity": False,
    },
}


@pytest.mark.parametrize("combo", COMBOS)
def test_manifests_validate_strict(chart: Chart, combo: str) -> None:
    objs = chart.render(COMBOS[combo])
    checked = 0
    for obj in objs:
        if is_crd_kind(obj):
            continue
        try:
            kubernetes_validate.validate(obj, VALIDATE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{obj['kind']}/{obj['metadata']['name']}: {exc.message} at "
                f"{'/'.join(map(str, exc.path))}"
            )
        checked += 1
    assert checked >= 3


def test_validator_is_strict() -> None:
    """Guard: strict mode does refuse an unknown field (so the test above means something)."""
    bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "extra": 1}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VALIDATE_VERSION, strict=True)
