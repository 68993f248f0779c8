"""`swapwise render admission-policy` proven equivalent to the webhook on a real 1.37 API server.

The acceptance test of the webhook-less mode (docs/admission-policy.md): every case of the
engine's table tests (tests/engine, recorded by tests/e2e/engine_cases.py) and a batch of
hypothesis-drawn pods and profiles (tests/support/strategies.py) is created twice on one
kube-apiserver v1.37: once in a namespace served by `swapwise serve` (the webhook), once in
a namespace served by the rendered MutatingAdmissionPolicy. The two stored pods must be
equal field by field, except the fields every create makes up (uid, timestamps, ...) and
`managedFields` (who wrote what: the webhook and the policy are different managers).
A pod the API server refuses must be refused on both paths with the same reason. The
warnings returned with each create must be the webhook's too, after the API server's prefix,
except those docs/admission-policy.md names (the resizePolicy and unreadable-annotation
warnings; pods that arrive with a swapwise.io/original annotation).

Both paths use failurePolicy Fail here, so a CEL error fails the test instead of silently
leaving a pod unchanged. The 1.37 binaries are built (into their own cache directory) when
missing, like every e2e test's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.e2e.cluster import (
    PROFILE_LABEL,
    ControlPlane,
    Swapwise,
    ensure_binaries,
    k8s_version,
    skip_unless_e2e,
    webhook_configuration,
)
from tests.e2e.engine_cases import table_cases
from tests.support.profile_spec import profile_fields
from tests.support.progress import uncaptured
from tests.support.strategies import pods, profiles
from webhook.engine import mutate_pod
from webhook.policy import Policy, build_policy
from webhook.profile import Profile
from webhook.render.admission_policy import render_admission_policies

# MutatingAdmissionPolicy is GA (v1) from 1.36; SWAPWISE_AP_LINE=1.34 runs the same test on
# the default line with the v1beta1 API behind its feature gate.
LINE = os.environ.get("SWAPWISE_AP_LINE", "1.37")
API_VERSION = "v1beta1" if LINE in ("1.34", "1.35") else "v1"
APISERVER_ARGS = ([] if API_VERSION == "v1" else [
    "--feature-gates=MutatingAdmissionPolicy=true",
    "--runtime-config=admissionregistration.k8s.io/v1beta1=true"])
PATH_LABEL = "e2e.swapwise.io/path"  # which of the two paths serves a namespace
# Its own control plane runs LINE's kube-apiserver whatever the session's line is, so it runs
# in the session of that line only (the e2e conftest deselects it elsewhere): once per run.
pytestmark = [pytest.mark.e2e, pytest.mark.smoke, pytest.mark.line(LINE)]
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


def _hypothesis_cases() -> tuple[list[Profile], list[tuple[dict[str, Any], int]]]:
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


def _cases(workdir: Path) -> tuple[dict[str, Profile], list[Case]]:
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
    drawn_profiles, drawn_pods = _hypothesis_cases()
    names = [name_of(p, "h") for p in drawn_profiles]
    cases += [Case(f"hypothesis[{i}]", pod, names[index])
              for i, (pod, index) in enumerate(drawn_pods) if names]
    return named, cases


def _api(cp: ControlPlane, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{cp.server}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=cp.admin_context(), timeout=30) as r:
            return int(r.status), json.load(r)
    except urllib.error.HTTPError as e:
        return int(e.code), json.loads(e.read() or b"{}")


def _create_pod(cp: ControlPlane, namespace: str, pod: dict[str, Any]
                ) -> tuple[int, Any, list[str]]:
    """POST a pod: status, body, and the warnings the API server returned with it."""
    request = urllib.request.Request(f"{cp.server}/api/v1/namespaces/{namespace}/pods",
                                     data=json.dumps(pod).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=cp.admin_context(), timeout=30) as r:
            status, body, headers = int(r.status), json.load(r), r.headers
    except urllib.error.HTTPError as e:
        status, body, headers = int(e.code), json.loads(e.read() or b"{}"), e.headers
    warnings = []
    for header in headers.get_all("Warning") or []:
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


def _ordered(warnings: list[str]) -> list[str]:
    """swapwise's warnings in their order, then the API server's own (field warnings such as
    `fractional byte value` for quantities beyond 8 PiB) sorted: those come before a Warn
    policy's but after a webhook's."""
    ours = [w for w in warnings if w.startswith("swapwise: ")]
    return ours + sorted(w for w in warnings if not w.startswith("swapwise: "))


def _create_all(cp: ControlPlane, objects: list[dict[str, Any]]) -> None:
    """POST each admission object (kubectl apply of ~100 large CEL objects is far slower)."""
    for obj in objects:
        group_version = obj["apiVersion"]
        kind = obj["kind"].lower()
        resource = kind[:-1] + "ies" if kind.endswith("y") else kind + "s"
        status, body = _api(cp, "POST", f"/apis/{group_version}/{resource}", obj)
        assert status == 201, f"{obj['kind']} {obj['metadata']['name']}: {status} {body}"


def _stored(status: int, body: dict[str, Any]) -> Any:
    """What is compared: the stored pod without volatile fields, or the refusal's reason."""
    if status >= 300:
        return {"refused": status, "reason": body.get("reason")}
    metadata = {k: v for k, v in body["metadata"].items() if k not in VOLATILE}
    # The service-account token volume gets a random name on every create.
    spec = json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access-*",
                             json.dumps(body["spec"])))
    return {"metadata": metadata, "spec": spec}


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, as `path: a != b` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for key in sorted(set(a) | set(b))
                for line in _differences(a.get(key), b.get(key), f"{path}.{key}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b, strict=False))
                for line in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path or '.'}: webhook {json.dumps(a)} != policy {json.dumps(b)}"]


def _pod(case: Case, name: str) -> dict[str, Any]:
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


def _probe(profile: Profile) -> dict[str, Any]:
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


@pytest.fixture(scope="module")
def cluster(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[ControlPlane]:
    skip_unless_e2e()
    with uncaptured(pytestconfig):
        # Only the API server runs admission: the 1.37 line adds one binary to the cache,
        # the rest of the control plane is the default line's (shared with every e2e test).
        binaries = ensure_binaries()
        apiserver = ensure_binaries(LINE, ["kube-apiserver"]) / "kube-apiserver"
    with ControlPlane(binaries, apiserver_args=APISERVER_ARGS, apiserver=apiserver) as cp:
        assert _api(cp, "GET", "/version")[1]["gitVersion"] == k8s_version(LINE)
        yield cp


def _serve_both(cp: ControlPlane, workdir: Path, named: dict[str, Profile]) -> Swapwise:
    """The webhook for namespaces labelled path=webhook, the policies for path=policy."""
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(yaml.safe_dump({
        "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
        "profiles": {name: profile_fields(p) for name, p in named.items()},
    }))
    server = Swapwise(workdir / "swapwise", policy=policy_file)
    server.start()
    config = webhook_configuration(server.url_base, server.ca_bundle, sorted(named),
                                   failure_policy="Fail")
    for hook in config["webhooks"]:
        hook["namespaceSelector"]["matchExpressions"].append(
            {"key": PATH_LABEL, "operator": "In", "values": ["webhook"]})
    cp.apply(json.dumps(config))
    objects = render_admission_policies(Policy(profiles=named), API_VERSION,
                                        failure_policy="Fail")
    for obj in objects:
        if obj["kind"].endswith("Binding"):
            obj["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"].append(
                {"key": PATH_LABEL, "operator": "In", "values": ["policy"]})
    (workdir / "admission-policies.yaml").write_text(yaml.safe_dump_all(objects))
    _create_all(cp, objects)
    for name in named:
        for path in ("webhook", "policy"):
            cp.create_namespace(f"{path}-{name}", {PROFILE_LABEL: name, PATH_LABEL: path})
    for name, profile in named.items():  # both paths live: a probe comes back mutated
        for path in ("webhook", "policy"):
            def mutated(ns: str = f"{path}-{name}", p: Profile = profile) -> bool:
                status, body = _api(cp, "POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                                    _probe(p))
                annotations = body.get("metadata", {}).get("annotations") or {}
                return status == 201 and annotations.get(PROFILE_LABEL) == p.name
            cp.wait_for(mutated, 60, what=f"{path} path of profile {name}")
    return server


def test_rendered_policies_store_the_same_pods_as_the_webhook(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    named, cases = _cases(tmp_path)
    server = _serve_both(cluster, tmp_path, named)
    mismatches: list[str] = []
    warning_mismatches: list[str] = []
    compared = 0  # cases whose warnings were compared and not empty
    try:
        for i, case in enumerate(cases):
            name = f"case-{i}"
            results = {}
            warned = {}
            for path in ("webhook", "policy"):
                status, body, warnings = _create_pod(cluster, f"{path}-{case.profile}",
                                                     _pod(case, name))
                results[path] = _stored(status, body)
                warned[path] = warnings if status == 201 else []
            expected = _ordered([w for w in warned["webhook"] if not NOT_REPEATED.fullmatch(w)])
            given = _ordered([WARN_PREFIX.sub("", w, count=1) for w in warned["policy"]])
            # The Warn policy reads its "before" from swapwise.io/original: a pod that came
            # with one (a second pass, a copy) is warned as if this admission changed it.
            annotated = ORIGINAL in json.dumps(case.pod.get("metadata") or {})
            compared += bool(expected) and not annotated
            if expected != given and not annotated:
                warning_mismatches.append(f"{case.id} (profile {case.profile}, {name}): "
                                          f"webhook {expected} != policy {given}")
            if results["webhook"] != results["policy"]:
                diff = "\n    ".join(_differences(results["webhook"], results["policy"]))
                mismatches.append(f"{case.id} (profile {case.profile}, {name}):\n"
                                  f"  pod: {json.dumps(case.pod)}\n    {diff}")
    finally:
        server.stop(grace=0)
    (tmp_path / "mismatches.txt").write_text("\n".join(mismatches))
    assert not mismatches, (f"{len(mismatches)} of {len(cases)} cases differ:\n"
                            + "\n".join(mismatches[:10]))
    # The Warn policy gives the webhook's warnings, but for the differences named above.
    assert compared > 20, f"only {compared} cases had warnings to compare"
    assert not warning_mismatches, (f"{len(warning_mismatches)} of {len(cases)} cases warn "
                                    "differently:\n" + "\n".join(warning_mismatches[:10]))


def test_warning_policy_explains_the_change(cluster: ControlPlane) -> None:
    """kubectl create --dry-run=server shows the webhook's warning (with the API server's
    prefix, which a ValidatingAdmissionPolicy cannot avoid)."""
    objects = render_admission_policies(Policy(profiles={"warned": Profile(name="warned")}),
                                        API_VERSION, failure_policy="Fail")
    _create_all(cluster, objects)
    cluster.create_namespace("warned", {PROFILE_LABEL: "warned"})
    pod = _probe(Profile(name="warned"))
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "2Gi"
    pod["spec"]["containers"][0]["name"] = "app"
    want = ("Validation failed for ValidatingAdmissionPolicy 'swapwise-warned-warn' with "
            "binding 'swapwise-warned-warn': swapwise: app memory request 2Gi -> 683Mi "
            "(limit 2Gi)")

    def warned() -> str | None:
        out = cluster.kubectl("create", "--dry-run=server", "-n", "warned", "-o", "json",
                              "-f", "-", input=json.dumps(pod))
        return out.stderr if want in out.stderr else None

    stderr = cluster.wait_for(warned, 60, what="the Warn policy's message")
    # and the pod's swap-backing need (1000 x (2048 - 683) / 683, rounded up), once each
    assert ("swapwise: needs nodes whose swap is >= 1999\u2030 of their RAM (node label "
            "swapwise.io/swap-permille, from label-nodes)") in stderr
    assert stderr.count("swapwise:") == 2, stderr


def test_namespace_override_gets_its_own_policy(cluster: ControlPlane) -> None:
    """A namespace override is served by its own policy; the profile's other namespaces keep
    the profile's values. The expected requests are the engine's, for each namespace."""
    document = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                "profiles": {"ov": {}}, "namespaces": {"ov-team": {"requestRatio": 0.25}}}
    policy = build_policy(document)
    _create_all(cluster, render_admission_policies(policy, API_VERSION, failure_policy="Fail"))
    pod = _probe(Profile(name="ov"))
    requests = []
    for namespace in ("ov-team", "ov-other"):
        cluster.create_namespace(namespace, {PROFILE_LABEL: "ov"})
        profile = policy.resolve("ov", namespace)
        assert profile is not None
        mutation = mutate_pod(pod, profile)
        want = jsonpatch.apply_patch(pod, mutation.patch)["spec"]["containers"][0]["resources"]

        def stored(ns: str = namespace) -> Any:
            status, body = _api(cluster, "POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                                {**pod, "metadata": {"name": "ov"}})
            annotations = body.get("metadata", {}).get("annotations") or {}
            return body if status == 201 and PROFILE_LABEL in annotations else None

        got = cluster.wait_for(stored, 60, what=f"policy for {namespace}")
        assert got["spec"]["containers"][0]["resources"] == want
        requests.append(want["requests"]["memory"])
    assert requests[0] != requests[1], "the override must change the request"
