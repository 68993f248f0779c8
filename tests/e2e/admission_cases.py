"""The cases of the admission-policy checks, shared by the e2e equivalence test
(tests/e2e/test_admission_policy.py), the recorder of the unit tier's golden outputs
(tests/e2e/record_cel_golden.py) and the golden test (tests/render/): the same pods and
profiles, and how the webhook's warnings and stored pods are compared with the policies'.

Pure: no control plane (the API calls are tests/e2e/admission_api.py's), so the unit tier
imports it without the e2e harness. A case is a (pod, profile) of the engine's table tests
(tests/engine, recorded by tests/e2e/engine_cases.py) or drawn by the project's strategies
(testkit/strategies.py), the same on every run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from testkit.profile_spec import profile_fields
from testkit.strategies import pods, profiles
from tests.e2e.engine_cases import table_cases
from webhook.profile import Profile

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


def policy_document(named: dict[str, Profile]) -> dict[str, Any]:
    """The policy file serving the cases' profiles (webhook and rendered policies alike), its
    keys sorted as the YAML the webhook reads and the golden recording's header store them: a
    nodeSelector's order is its expressions' order, so every reader must see one order."""
    document = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                "profiles": {name: profile_fields(p) for name, p in named.items()}}
    result: dict[str, Any] = json.loads(json.dumps(document, sort_keys=True))
    return result
