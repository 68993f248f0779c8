"""`swapwise render admission-policy` proven equivalent to the webhook on a real 1.37 API server.

The acceptance test of the webhook-less mode (docs/admission-policy.md): every case of the
engine's table tests (tests/engine, recorded by tests/e2e/engine_cases.py) and a batch of
hypothesis-drawn pods and profiles (testkit/strategies.py) is created twice on one
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

import json
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.e2e.admission_api import API_VERSION, LINE, api, create_all, create_pod
from tests.e2e.admission_cases import (
    NOT_REPEATED,
    ORIGINAL,
    WARN_PREFIX,
    all_cases,
    differences,
    ordered_warnings,
    pod_for,
    policy_document,
    probe_pod,
    stored,
)
from tests.e2e.cluster import PROFILE_LABEL, ControlPlane, Swapwise, webhook_configuration
from webhook.engine import mutate_pod
from webhook.policy import Policy, build_policy
from webhook.profile import Profile
from webhook.render.admission_policy import render_admission_policies

PATH_LABEL = "e2e.swapwise.io/path"  # which of the two paths serves a namespace
# Its own control plane runs LINE's kube-apiserver whatever the session's line is, so it runs
# in the session of that line only (the e2e conftest deselects it elsewhere): once per run.
pytestmark = [pytest.mark.e2e, pytest.mark.smoke, pytest.mark.line(LINE)]


def _serve_both(cp: ControlPlane, workdir: Path, named: dict[str, Profile]) -> Swapwise:
    """The webhook for namespaces labelled path=webhook, the policies for path=policy."""
    document = policy_document(named)  # one document, one key order, for both paths
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(document))
    server = Swapwise(workdir / "swapwise", policy=policy_file)
    server.start()
    config = webhook_configuration(server.url_base, server.ca_bundle, sorted(named),
                                   failure_policy="Fail")
    for hook in config["webhooks"]:
        hook["namespaceSelector"]["matchExpressions"].append(
            {"key": PATH_LABEL, "operator": "In", "values": ["webhook"]})
    cp.apply(json.dumps(config))
    objects = render_admission_policies(build_policy(document), API_VERSION,
                                        failure_policy="Fail")
    for obj in objects:
        if obj["kind"].endswith("Binding"):
            obj["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"].append(
                {"key": PATH_LABEL, "operator": "In", "values": ["policy"]})
    (workdir / "admission-policies.yaml").write_text(yaml.safe_dump_all(objects))
    create_all(cp, objects)
    for name in named:
        for path in ("webhook", "policy"):
            cp.create_namespace(f"{path}-{name}", {PROFILE_LABEL: name, PATH_LABEL: path})
    for name, profile in named.items():  # both paths live: a probe comes back mutated
        for path in ("webhook", "policy"):
            def mutated(ns: str = f"{path}-{name}", p: Profile = profile) -> bool:
                status, body = api(cp, "POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                                    probe_pod(p))
                annotations = body.get("metadata", {}).get("annotations") or {}
                return status == 201 and annotations.get(PROFILE_LABEL) == p.name
            cp.wait_for(mutated, 60, what=f"{path} path of profile {name}")
    return server


def test_rendered_policies_store_the_same_pods_as_the_webhook(
    policy_cluster: ControlPlane, tmp_path: Path
) -> None:
    named, cases = all_cases(tmp_path)
    server = _serve_both(policy_cluster, tmp_path, named)
    mismatches: list[str] = []
    warning_mismatches: list[str] = []
    compared = 0  # cases whose warnings were compared and not empty
    try:
        for i, case in enumerate(cases):
            name = f"case-{i}"
            results = {}
            warned = {}
            for path in ("webhook", "policy"):
                status, body, warnings = create_pod(policy_cluster, f"{path}-{case.profile}",
                                                     pod_for(case, name))
                results[path] = stored(status, body)
                warned[path] = warnings if status == 201 else []
            expected = ordered_warnings([w for w in warned["webhook"]
                                         if not NOT_REPEATED.fullmatch(w)])
            given = ordered_warnings([WARN_PREFIX.sub("", w, count=1)
                                      for w in warned["policy"]])
            # The Warn policy reads its "before" from swapwise.io/original: a pod that came
            # with one (a second pass, a copy) is warned as if this admission changed it.
            annotated = ORIGINAL in json.dumps(case.pod.get("metadata") or {})
            compared += bool(expected) and not annotated
            if expected != given and not annotated:
                warning_mismatches.append(f"{case.id} (profile {case.profile}, {name}): "
                                          f"webhook {expected} != policy {given}")
            if results["webhook"] != results["policy"]:
                diff = "\n    ".join(differences(results["webhook"], results["policy"]))
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


def test_warning_policy_explains_the_change(policy_cluster: ControlPlane) -> None:
    """kubectl create --dry-run=server shows the webhook's warning (with the API server's
    prefix, which a ValidatingAdmissionPolicy cannot avoid)."""
    objects = render_admission_policies(Policy(profiles={"warned": Profile(name="warned")}),
                                        API_VERSION, failure_policy="Fail")
    create_all(policy_cluster, objects)
    policy_cluster.create_namespace("warned", {PROFILE_LABEL: "warned"})
    pod = probe_pod(Profile(name="warned"))
    pod["spec"]["containers"][0]["resources"]["limits"]["memory"] = "2Gi"
    pod["spec"]["containers"][0]["name"] = "app"
    want = ("Validation failed for ValidatingAdmissionPolicy 'swapwise-warned-warn' with "
            "binding 'swapwise-warned-warn': swapwise: app memory request 2Gi -> 683Mi "
            "(limit 2Gi)")

    def warned() -> str | None:
        out = policy_cluster.kubectl("create", "--dry-run=server", "-n", "warned", "-o", "json",
                                     "-f", "-", input=json.dumps(pod))
        return out.stderr if want in out.stderr else None

    stderr = policy_cluster.wait_for(warned, 60, what="the Warn policy's message")
    # and the pod's swap-backing need (1000 x (2048 - 683) / 683, rounded up), once each
    assert ("swapwise: needs nodes whose swap is >= 1999\u2030 of their RAM (node label "
            "swapwise.io/swap-permille, from the node agent)") in stderr
    assert stderr.count("swapwise:") == 2, stderr


def test_namespace_override_gets_its_own_policy(policy_cluster: ControlPlane) -> None:
    """A namespace override is served by its own policy; the profile's other namespaces keep
    the profile's values. The expected requests are the engine's, for each namespace."""
    document = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                "profiles": {"ov": {}}, "namespaces": {"ov-team": {"requestRatio": 0.25}}}
    policy = build_policy(document)
    create_all(policy_cluster,
               render_admission_policies(policy, API_VERSION, failure_policy="Fail"))
    pod = probe_pod(Profile(name="ov"))
    requests = []
    for namespace in ("ov-team", "ov-other"):
        policy_cluster.create_namespace(namespace, {PROFILE_LABEL: "ov"})
        profile = policy.resolve("ov", namespace)
        assert profile is not None
        mutation = mutate_pod(pod, profile)
        want = jsonpatch.apply_patch(pod, mutation.patch)["spec"]["containers"][0]["resources"]

        def stored(ns: str = namespace) -> Any:
            status, body = api(policy_cluster, "POST", f"/api/v1/namespaces/{ns}/pods?dryRun=All",
                                {**pod, "metadata": {"name": "ov"}})
            annotations = body.get("metadata", {}).get("annotations") or {}
            return body if status == 201 and PROFILE_LABEL in annotations else None

        got = policy_cluster.wait_for(stored, 60, what=f"policy for {namespace}")
        assert got["spec"]["containers"][0]["resources"] == want
        requests.append(want["requests"]["memory"])
    assert requests[0] != requests[1], "the override must change the request"
