"""The cases and the API calls of the admission-policy checks, shared by the e2e
equivalence test (tests/e2e/test_admission_policy.py) and the recorder of the unit tier's
golden outputs (tests/e2e/record_cel_golden.py): the same pods, profiles and requests.

A case is a (pod, profile) of the engine's table tests (tests/engine, recorded by
tests/e2e/engine_cases.py) or drawn by the project's strategies (testkit/strategies.py),
the same on every run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from testkit.profile_spec import profile_fields
from testkit.strategies import pods, profiles
from tests.e2e.cluster import (
    DEFAULT_LINE,
    ControlPlane,
    ensure_binaries,
    k8s_version,
    skip_unless_e2e,
)
from tests.e2e.engine_cases import table_cases
from webhook.profile import Profile

# The session's line (make test: 1.34, where MutatingAdmissionPolicy is v1beta1 behind its
# feature gate, as 1.34 and 1.35 users run it; make e2e-1.37: v1, GA from 1.36).
# SWAPWISE_AP_LINE picks another line's API server for these tests alone.
LINE = os.environ.get("SWAPWISE_AP_LINE") or DEFAULT_LINE
API_VERSION = "v1beta1" if LINE in ("1.34", "1.35") else "v1"
APISERVER_ARGS = ([] if API_VERSION == "v1" else [
    "--feature-gates=MutatingAdmissionPolicy=true",
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true"])
HYPOTHESIS_PROFILES = int(os.environ.get("SWAPWISE_AP_PROFILES", "8"))
HYPOTHESIS_PODS = int(os.environ.get("SWAPWISE_AP_PODS", "120"))
# Fields each create makes up, and who-wrote-what bookkeeping: never compared.
VOLATILE = ("uid", "resourceVersion", "creationTimestamp", "managedFields", "namespace",
            "generation")


@dataclasses.dataclass
class Case:
    id: str
    pod: dict[str, Any]
    profile: str


def hypothesis_cases() -> tuple[list[Profile], list[tuple[dict[str, Any], int]]]:
    """Profiles and pods drawn by the project's strategies, the same on every run."""
    drawn_profiles: list[Profile] = []
    drawn_pods: list[tuple[dict[str, Any], int]] = []
    def common(examples: int) -> settings:
        return settings(derandomize=True, database=None, phases=[Phase.generate],
                        deadline=None, suppress_health_check=list(HealthCheck),
                        max_examples=examples)

    @common(HYPOTHESIS_PROFILES)
    @given(profiles())
    def draw_profile(profile: Profile) -> None:
        drawn_profiles.append(profile)

    @common(HYPOTHESIS_PODS)
    @given(pods(), st.integers(0, max(HYPOTHESIS_PROFILES - 1, 0)))
    def draw_pod(pod: dict[str, Any], index: int) -> None:
        drawn_pods.append((pod, index))

    draw_profile()
    draw_pod()
    return drawn_profiles, drawn_pods


def all_cases(workdir: Path) -> tuple[dict[str, Profile], list[Case]]:
    """Every case, with profiles renamed t0.. (tables) and h0.. (hypothesis)."""
    named: dict[str, Profile] = {}
    by_repr: dict[str, str] = {}

    def name_of(profile: Profile, prefix: str) -> str:
        key = repr(dataclasses.replace(profile, name=""))
        if key not in by_repr:
            name = f"{prefix}{sum(n.startswith(prefix) for n in named)}"
            by_repr[key] = name
            named[name] = dataclasses.replace(profile, name=name)
        return by_repr[key]

    cases = [Case(test_id, pod, name_of(profile, "t"))
             for test_id, pod, profile in table_cases(workdir)]
    drawn_profiles, drawn_pods = hypothesis_cases()
    names = [name_of(p, "h") for p in drawn_profiles]
    cases += [Case(f"hypothesis[{i}]", pod, names[index])
              for i, (pod, index) in enumerate(drawn_pods) if names]
    return named, cases


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


# Webhook warnings a Warn policy cannot give (docs/admission-policy.md), and the prefix the
# API server puts before every Warn message.
NOT_REPEATED = re.compile(r"swapwise: (\S+ memory resizePolicy .* -> RestartContainer "
                          r"\(required with swap\)|ignored unreadable swapwise\.io/original.*)")
ORIGINAL = "swapwise.io/original"
WARN_PREFIX = re.compile(r"Validation failed for ValidatingAdmissionPolicy '[^']+' with "
                         r"binding '[^']+': ")


def ordered_warnings(warnings: list[str]) -> list[str]:
    """swapwise's warnings in their order, then the API server's own (field warnings such as
    `fractional byte value` for quantities beyond 8 PiB) sorted: those come before a Warn
    policy's but after a webhook's."""
    ours = [w for w in warnings if w.startswith("swapwise: ")]
    return ours + sorted(w for w in warnings if not w.startswith("swapwise: "))


def create_all(cp: ControlPlane, objects: list[dict[str, Any]]) -> None:
    """POST each admission object (kubectl apply of ~100 large CEL objects is far slower)."""
    for obj in objects:
        group_version = obj["apiVersion"]
        kind = obj["kind"].lower()
        resource = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        status, body = api(cp, "POST", f"/apis/{group_version}/{resource}", obj)
        assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"


def stored(status: int, body: dict[str, Any]) -> Any:
    """What is compared: the stored pod without volatile fields, or the refusal's reason."""
    if status >= 300:
        return {"refused": status, "reason": body.get("reason")}
    metadata = {k: v for k, v in body["metadata"].items() if k not in VOLATILE}
    # The service-account token volume gets a random name on every create.
    spec = json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access-*",
                             json.dumps(body["spec"])))
    return {"metadata": metadata, "spec": spec}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as `path: a != b` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for key in sorted(set(a) | set(b))
                for line in differences(a.get(key), b.get(key), f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=False))
                for line in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '.'}: webhook {json.dumps(a)} != policy {json.dumps(b)}"]


def pod_for(case: Case, name: str) -> dict[str, Any]:
    pod = json.loads(json.dumps(case.pod))
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    metadata = {**metadata, "name": name}
    metadata.pop("namespace", None)
    pod["metadata"] = metadata
    for field in ("containers", "initContainers"):  # the engine ignores images; the API not
        items = pod.get("spec", {}).get(field) if isinstance(pod.get("spec"), dict) else None
        for c in items if isinstance(items, list) else []:
            if isinstance(c, dict):
                c.setdefault("image", "registry.example/app:1")
    return pod


def probe_pod(profile: Profile) -> dict[str, Any]:
    """A pod every profile mutates (Burstable, limit only, labels its podSelector wants)."""
    labels: dict[str, str] = {}
    if profile.pod_selector is not None:
        labels.update(profile.pod_selector.match_labels)
        for key, operator, values in profile.pod_selector.match_expressions:
            if operator == "In":
                labels[key] = values[0]
            elif operator == "Exists":
                labels[key] = "x"
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "probe", "labels": labels},
            "spec": {"containers": [{"name": "probe", "image": "registry.example/app:1",
                                     "resources": {"limits": {"memory": "4Gi"}}}]}}


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


def policy_document(named: dict[str, Profile]) -> dict[str, Any]:
    """The policy file serving the cases' profiles (webhook and rendered policies alike)."""
    return {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
            "profiles": {name: profile_fields(p) for name, p in named.items()}}
