"""The API calls of the admission-policy checks (tests/e2e/test_admission_policy.py and
tests/e2e/record_cel_golden.py): a control plane of the admission-policy line, objects and
pods created on it. The cases themselves are tests/e2e/admission_cases.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.e2e.cluster import (
    DEFAULT_LINE,
    ControlPlane,
    ensure_binaries,
    k8s_version,
    skip_unless_e2e,
)

# The session's line (make test: 1.34, where MutatingAdmissionPolicy is v1beta1 behind its
# feature gate, as 1.34 and 1.35 users run it; make e2e-1.37: v1, GA from 1.36).
# SWAPWISE_AP_LINE picks another line's API server for these tests alone.
LINE = os.environ.get("SWAPWISE_AP_LINE") or DEFAULT_LINE
API_VERSION = "v1beta1" if LINE in ("1.34", "1.35") else "v1"
APISERVER_ARGS = ([] if API_VERSION == "v1" else [
    "--feature-gates=MutatingAdmissionPolicy=true",
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true"])


def api(cp: ControlPlane, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{cp.server}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=cp.admin_context(), timeout=30) as r:
            return int(r.status), json.load(r)
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read() or b"{}")


def create_pod(cp: ControlPlane, namespace: str, pod: dict[str, Any], *, dry_run: bool = False
               ) -> tuple[int, Any, list[str]]:
    """POST a pod: status, body, and the warnings the API server returned with it. A dry run
    is admitted as a create is (mutating policies included) and stores nothing."""
    query = "?dryRun=All" if dry_run else ""
    request = urllib.request.Request(f"{cp.server}/api/v1/namespaces/{namespace}/pods{query}",
                                     data=json.dumps(pod).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=cp.admin_context(), timeout=30) as r:
            status, body, headers = int(r.status), json.load(r), r.headers
    except urllib.error.HTTPError as e:
        status, body, headers = int(e.code), json.loads(e.read() or b"{}"), e.headers
    warnings = []
    for header in headers.get_all("Warning") or []:
        # http.client decodes header bytes as latin-1; the API server sends UTF-8 (the ‰).
        with contextlib.suppress(UnicodeError):
            header = header.encode("latin-1").decode("utf-8")
        match = re.fullmatch(r'\d{3} \S+ "(.*)"', header)
        if match:
            warnings.append(match.group(1).replace('\\"', '"').replace("\\\\", "\\"))
    return status, body, warnings


def create_all(cp: ControlPlane, objects: list[dict[str, Any]]) -> None:
    """POST each admission object (kubectl apply of ~100 large CEL objects is far slower)."""
    for obj in objects:
        group_version = obj["apiVersion"]
        kind = obj["kind"].lower()
        resource = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        status, body = api(cp, "POST", f"/apis/{group_version}/{resource}", obj)
        assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"


@contextmanager
def policy_control_plane() -> Iterator[ControlPlane]:
    """A control plane whose API server is LINE's (only the API server runs admission: the
    1.37 line adds one binary to the cache, the rest is the default line's, shared with every
    e2e test), built when missing."""
    skip_unless_e2e()
    binaries = ensure_binaries()
    apiserver = ensure_binaries(LINE, ["kube-apiserver"]) / "kube-apiserver"
    with ControlPlane(binaries, apiserver_args=APISERVER_ARGS, apiserver=apiserver) as cp:
        assert api(cp, "GET", "/version")[1]["gitVersion"] == k8s_version(LINE)
        yield cp
