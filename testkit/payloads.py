"""AdmissionReviews and requests as kube-apiserver sends them, for benchmarks and load tests.

What the API server sends a webhook (captured from kube-apiserver 1.34 by
benchmarks/capture.py, kept in benchmarks/data/captured/):

- ``POST /mutate/<profile>?timeout=<timeoutSeconds>s``: it always appends the webhook's
  timeout as a query (10 s is the API's default, the chart sets 5 s);
- headers ``Host``, ``User-Agent: kube-apiserver-admission``, ``Content-Length``,
  ``Accept: application/json, */*``, ``Content-Type: application/json``,
  ``Accept-Encoding: gzip``, over HTTP/1.1 keep-alive;
- the review as Go serialises it: compact JSON, fields in struct order, the pod after
  defaulting and the ServiceAccount plugin (projected token volume, default tolerations,
  termination message paths, ...), with its ``managedFields`` and an empty ``status``.

So the size of a request, and the JSON parse and serialize cost, match production rather
than a toy pod. benchmarks/tests/test_payloads.py checks the generated review against the
captured one.
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

PROFILE = "sandbox"
# The query the API server appends (the webhook's timeoutSeconds; 10 s is the default).
QUERY = "timeout=10s"
ADMISSION_PATH = f"/mutate/{PROFILE}?{QUERY}"
# kube-apiserver's headers, in its order; Host and Content-Length are per request.
HEADERS: list[tuple[str, str]] = [
    ("User-Agent", "kube-apiserver-admission"),
    ("Accept", "application/json, */*"),
    ("Content-Type", "application/json"),
    ("Accept-Encoding", "gzip"),
]
TOKEN_VOLUME = "kube-api-access-x7k2p"


def request_bytes(body: bytes, path: str = ADMISSION_PATH, host: str = "swapwise.swapwise.svc:443"
                  ) -> bytes:
    """One HTTP/1.1 request exactly as kube-apiserver writes it."""
    head = [f"POST {path} HTTP/1.1", f"Host: {host}", HEADERS[0][0] + ": " + HEADERS[0][1],
            f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in HEADERS[1:])]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _container(name: str, memory: str, index: int, sidecar: bool = False) -> dict[str, Any]:
    """A container after defaulting, its fields in the order Go writes them."""
    port = 8080 + index
    container: dict[str, Any] = {
        "name": name,
        "image": f"registry.example.com/team/{name}:1.{index}.0",
        "args": ["--port=8080", f"--shard={index}", "--log-format=json"],
        "ports": [{"name": f"http-{index}", "containerPort": port, "protocol": "TCP"}],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1",
                                                            "fieldPath": "metadata.name"}}},
            {"name": "LOG_LEVEL", "value": "info"},
        ],
        "resources": {
            "limits": {"cpu": "250m", "memory": memory},
            "requests": {"cpu": "250m", "memory": memory},
        },
    }
    if sidecar:
        container["restartPolicy"] = "Always"
    container.update({
        "volumeMounts": [{"name": TOKEN_VOLUME, "readOnly": True,
                          "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": port, "scheme": "HTTP"},
            "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
            "failureThreshold": 3,
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "securityContext": {"capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                            "allowPrivilegeEscalation": False},
    })
    return container


# Lists the API server merges by key (their managedFields entries are "k:{...}").
_KEYS = {"containers": ("name",), "initContainers": ("name",), "env": ("name",),
         "ports": ("containerPort", "protocol"), "ownerReferences": ("uid",)}

_ATOMIC = {"fieldRef"}  # structs the API marks atomic (ObjectFieldSelector)


def _fields(value: Any, name: str = "") -> dict[str, Any]:
    """The FieldsV1 set of ``value`` (sorted, as the API server writes it)."""
    if isinstance(value, dict) and name not in _ATOMIC:
        out: dict[str, Any] = {"f:" + key: _fields(child, key) for key, child in value.items()}
    elif isinstance(value, list) and name in _KEYS:
        out = {}
        for item in value:
            key = json.dumps({k: item[k] for k in _KEYS[name]}, separators=(",", ":"))
            out["k:" + key] = _fields(item)
    else:
        return {}  # a scalar, an atomic list (args, tolerations) or an atomic struct
    if name not in ("metadata", "spec", "containers"):
        out["."] = {}
    return dict(sorted(out.items()))


def managed_fields(metadata: dict[str, Any], spec: dict[str, Any], manager: str
                   ) -> list[dict[str, Any]]:
    """What the creating client's request set, as the API server records it (the volume the
    ServiceAccount plugin adds is not the client's)."""
    spec = {k: v for k, v in spec.items() if k not in ("volumes", "serviceAccountName",
                                                        "serviceAccount")}
    for key in ("containers", "initContainers"):
        if key in spec:
            spec[key] = [{k: v for k, v in c.items() if k != "volumeMounts"} for c in spec[key]]
    meta = {k: v for k, v in metadata.items() if k in ("generateName", "labels", "annotations",
                                                       "ownerReferences")}
    return [{"manager": manager, "operation": "Update", "apiVersion": "v1",
             "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": _fields(meta, "metadata"),
                          "f:spec": _fields(spec, "spec")}}]


def pod(containers: int, sidecar: bool = True, *, owned: bool = True,
        manager: str = "kube-controller-manager", namespace: str = "apps") -> dict[str, Any]:
    """A Deployment's pod with ``containers`` containers (one a native sidecar), as the API
    server hands it to mutating webhooks. ``owned=False``: as a user creates it."""
    init = [_container("log-shipper", "128Mi", 0, sidecar=True)] if sidecar else []
    main = [_container(f"app-{i}", ["2Gi", "1Gi", "512Mi", "3Gi"][i % 4], i + 1)
            for i in range(containers - len(init))]
    spec: dict[str, Any] = {
        "volumes": [{"name": TOKEN_VOLUME, "projected": {"sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt",
                           "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {
                "apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}},
        ], "defaultMode": 420}}],
    }
    if init:
        spec["initContainers"] = init
    spec.update({
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
    })
    metadata: dict[str, Any] = {
        "generateName": "web-7d9c8b6f5-" if owned else "bench-",
        "namespace": namespace,
        "labels": {"app.kubernetes.io/name": "web", "pod-template-hash": "7d9c8b6f5"},
    }
    if owned:
        metadata["annotations"] = {"kubectl.kubernetes.io/restartedAt": "2025-01-01T00:00:00Z"}
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                        "name": "web-7d9c8b6f5", "uid": str(uuid.uuid4()),
                                        "controller": True, "blockOwnerDeletion": True}]
    metadata["managedFields"] = managed_fields(metadata, spec, manager)
    return {"kind": "Pod", "apiVersion": "v1", "metadata": metadata, "spec": spec,
            "status": {}}


REPLICASET_CONTROLLER = {
    "username": "system:serviceaccount:kube-system:replicaset-controller",
    "uid": "5b0c2a8e-6d3f-4a51-9f8e-2f1d7c3b9a10",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system",
               "system:authenticated"],
    "extra": {"authentication.kubernetes.io/credential-id": [
        "JTI=0b6f1c3e-93a5-4d7a-8c2e-51f0a9d4e7b2"]},
}


def review(obj: dict[str, Any], uid: str | None = None, *,
           user: dict[str, Any] | None = None, options: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    """The AdmissionReview of a pod CREATE, fields in the order Go writes them."""
    namespace = obj.get("metadata", {}).get("namespace", "apps")
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": user or REPLICASET_CONTROLLER,
            "object": obj,
            "oldObject": None,
            "dryRun": False,
            "options": options or {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def dumps(value: Any) -> bytes:
    """JSON as Go's encoding/json writes it: compact, keys in the order given, no escaping
    beyond what it needs (the payloads are ASCII), ending in a newline as its Encoder does."""
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def review_bytes(containers: int) -> bytes:
    return dumps(review(pod(containers)))
