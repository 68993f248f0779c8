"""The rendered admission policies against the engine, in the unit tier, without a control
plane: what a real kube-apiserver stored under the rendered policies (recorded once,
tests/data/admission-policy-golden.json) is what the engine gives for the same pods.

The policies' JSONPatch and library functions are the API server's own, so the API server
itself is the CEL interpreter: tests/e2e/record_cel_golden.py created every case of the
equivalence test (the engine's table cases and drawn pods and profiles) under the rendered
policies and kept what was stored. Here the engine reshapes the pod as admission received
it, and must give the same stored pod and the same warnings. The recording names the
rendering it was made with: a renderer change without a new recording fails here
(``make admission-policy-golden`` records again, on the 1.37 line).
"""

from __future__ import annotations

import json
from typing import Any

import jsonpatch

from testkit import golden
from tests.e2e.admission_cases import NOT_REPEATED, ORIGINAL, ordered_warnings
from webhook.engine import reshape
from webhook.policy import build_policy
from webhook.render.admission_policy import render_admission_policies

RECORDED = golden.load()
HEADER = RECORDED["header"]
POLICY = build_policy(HEADER["policy"])


def _accepted(case: dict[str, Any]) -> bool:
    return "policy_patch" in case


def test_the_recording_is_of_this_rendering() -> None:
    objects = render_admission_policies(POLICY, HEADER["apiVersion"], failure_policy="Fail")
    assert golden.rendered_digest(objects) == HEADER["renderedSha256"], (
        "the rendered admission policies changed since tests/data/admission-policy-golden.json "
        "was recorded: run `make admission-policy-golden` (a 1.37 API server) and commit it")


def test_the_recording_is_not_vacuous() -> None:
    cases = RECORDED["cases"]
    accepted = [c for c in cases if _accepted(c)]
    changed = [c for c in accepted if c["policy_patch"]]
    # Some table cases are pods the API server refuses before admission (both recorded).
    assert len(cases) > 300 and len(accepted) > 250, (len(cases), len(accepted))
    assert len(changed) > 100, len(changed)
    assert len({c["profile"] for c in changed}) > 20, "too few profiles ever mutated"
    # A pod the API server took as it came is never refused once the policies changed it.
    assert all("refused" in c["admitted"] for c in cases if not _accepted(c))


def test_engine_stores_what_the_rendered_policies_stored() -> None:
    mismatches = []
    for case in RECORDED["cases"]:
        if not _accepted(case):
            continue
        admitted = case["admitted"]
        want = jsonpatch.apply_patch(admitted, case["policy_patch"])
        profile = POLICY.profiles[case["profile"]]
        got = reshape(admitted, profile).after
        if golden.comparable(got) != golden.comparable(want):
            patch = jsonpatch.make_patch(golden.comparable(want), golden.comparable(got)).patch
            mismatches.append(f"{case['id']} (profile {case['profile']}): engine differs "
                              f"from the API server by {json.dumps(patch)[:600]}")
    assert not mismatches, f"{len(mismatches)} cases:\n" + "\n".join(mismatches[:10])


def test_engine_warns_as_the_rendered_policies_warned() -> None:
    mismatches, compared = [], 0
    for case in RECORDED["cases"]:
        admitted = case["admitted"]
        if not _accepted(case) or ORIGINAL in json.dumps(admitted.get("metadata") or {}):
            continue  # the Warn policy reads its "before" from swapwise.io/original
        mutation = reshape(admitted, POLICY.profiles[case["profile"]]).mutation
        want = ordered_warnings([w for w in mutation.warnings if not NOT_REPEATED.fullmatch(w)])
        given = ordered_warnings([w for w in case["warnings"] if w.startswith("swapwise: ")])
        compared += bool(want)
        if want != given:
            mismatches.append(f"{case['id']}: engine {want} != policy {given}")
    assert compared > 20, compared
    assert not mismatches, f"{len(mismatches)} cases:\n" + "\n".join(mismatches[:10])

