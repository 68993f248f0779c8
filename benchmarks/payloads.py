"""AdmissionReviews as the API server sends them, for benchmarks and load tests.

The pods carry what defaulting adds before mutating webhooks run (service account
volume, default tolerations, termination message paths, ...) so their size, and the
JSON parse and serialize cost, match production rather than a toy pod.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

POLICY_YAML = b"""\
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  sandbox:
    swapRatio: 2
    minRequest: 64Mi
"""


def _container(name: str, memory: str, index: int) -> dict[str, Any]:
    return {
        "name": name,
        "image": f"registry.example.com/team/{name}:1.{index}.0",
        "imagePullPolicy": "IfNotPresent",
        "args": ["--port=8080", f"--shard={index}", "--log-format=json"],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                            "fieldPath": "metadata.name"}}},
            {"name": "LOG_LEVEL", "value": "info"},
        ],
        "ports": [{"containerPort": 8080 + index, "name": f"http-{index}", "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": "250m", "memory": memory},
            "limits": {"cpu": "250m", "memory": memory},
        },
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": 8080 + index, "scheme": "HTTP"},
            "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1,
            "failureThreshold": 3,
        },
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "capabilities": {"drop": ["ALL"]}},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
    }


def pod(containers: int, sidecar: bool = True) -> dict[str, Any]:
    """A Deployment's pod with ``containers`` containers (one a native sidecar)."""
    init = []
    if sidecar:
        shipper = _container("log-shipper", "128Mi", 0)
        shipper["restartPolicy"] = "Always"
        init.append(shipper)
    main = [_container(f"app-{i}", ["2Gi", "1Gi", "512Mi", "3Gi"][i % 4], i + 1)
            for i in range(containers - len(init))]
    spec: dict[str, Any] = {
        "containers": main,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "serviceAccount": "default",
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
             "effect": "NoExecute", "tolerationSeconds": 300},
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ]}}],
    }
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-7d9c8b6f5-",
            "namespace": "apps",
            "labels": {"app.kubernetes.io/name": "web", "pod-template-hash": "7d9c8b6f5"},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                 "name": "web-7d9c8b6f5", "uid": str(uuid.uuid4()),
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


def review(obj: dict[str, Any], uid: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "uid": str(uuid.uuid4()),
                         "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def review_bytes(containers: int) -> bytes:
    return json.dumps(review(pod(containers))).encode()
