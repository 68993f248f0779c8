"""Chart metadata, `helm lint --strict`, and values the chart must refuse with a clear message."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import yaml
from chartlib import CHART, Chart

PROFILE_PATH = "/policy/profiles/default"


def test_chart_metadata() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2"
    assert meta["name"] == "swapwise"
    assert meta["version"] == "0.1.0"
    assert meta["appVersion"] == "0.1.0"
    assert meta["kubeVersion"] == ">=1.34.0-0"


def test_schema_is_draft_07() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(schema)
    # The chart's own defaults are valid values.
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(defaults)
    fields = set(schema["definitions"]["profile"]["properties"])
    assert fields == {
        "swapRatio",
        "requestRatio",
        "minRequest",
        "maxLimitRequestRatio",
        "defaultLimit",
        "guaranteedPods",
        "vpaPods",
        "resizePolicy",
        "podSelector",
        "placement",
    }
    placement = schema["definitions"]["profile"]["properties"]["placement"]
    assert set(placement["properties"]) == {"mode", "nodeSelector", "weight", "tolerations",
                                            "swapBacking"}


LINT_CASES: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "certManager": {
        "certs": {"mode": "certManager"},
        "metrics": {"serviceMonitor": {"enabled": True}},
    },
    "secret": {"certs": {"mode": "secret", "secretName": "tls", "caBundle": "Zm9v"}},
    "url": {"webhook": {"url": "https://127.0.0.1:8443", "failurePolicy": "Fail"}},
}


@pytest.mark.parametrize("case", LINT_CASES)
def test_lint_strict(chart: Chart, case: str) -> None:
    proc = chart.lint(LINT_CASES[case])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout


def _profile(**fields: Any) -> dict[str, Any]:
    return {"policy": {"profiles": {"default": fields}}}


# (values, what the message must say)
REJECTED: dict[str, tuple[dict[str, Any], list[str]]] = {
    "failurePolicy": (
        {"webhook": {"failurePolicy": "Sometimes"}},
        ["/webhook/failurePolicy", "'Ignore', 'Fail'"],
    ),
    "timeout 0": ({"webhook": {"timeoutSeconds": 0}}, ["/webhook/timeoutSeconds", "minimum"]),
    "timeout 31": ({"webhook": {"timeoutSeconds": 31}}, ["/webhook/timeoutSeconds", "maximum"]),
    "timeout string": ({"webhook": {"timeoutSeconds": "5s"}}, ["/webhook/timeoutSeconds"]),
    "certs.mode": (
        {"certs": {"mode": "vault"}},
        ["/certs/mode", "'selfSigned', 'certManager', 'secret'"],
    ),
    "url not https": ({"webhook": {"url": "http://127.0.0.1:8443"}}, ["/webhook/url", "https"]),
    "excluded ns": (
        {"webhook": {"excludeNamespaces": ["Not_A_Namespace"]}},
        ["/webhook/excludeNamespaces/0"],
    ),
    "swapRatio 0": (_profile(swapRatio=0), [f"{PROFILE_PATH}/swapRatio", "exclusiveMinimum"]),
    "swapRatio negative": (_profile(swapRatio=-1), [f"{PROFILE_PATH}/swapRatio"]),
    "requestRatio 0": (_profile(requestRatio=0), [f"{PROFILE_PATH}/requestRatio"]),
    "requestRatio > 1": (
        _profile(requestRatio=1.5), [f"{PROFILE_PATH}/requestRatio", "exclusiveMaximum"]),
    "requestRatio 1": (
        _profile(requestRatio=1), [f"{PROFILE_PATH}/requestRatio", "exclusiveMaximum"]),
    "both ratios": (
        _profile(swapRatio=2, requestRatio=0.3),
        ["policy.profiles.default: give swapRatio or requestRatio, not both"],
    ),
    "maxLimitRequestRatio < 1": (
        _profile(maxLimitRequestRatio=0.5),
        [f"{PROFILE_PATH}/maxLimitRequestRatio"],
    ),
    "maxLimitRequestRatio 1": (
        _profile(maxLimitRequestRatio=1),
        [f"{PROFILE_PATH}/maxLimitRequestRatio", "exclusiveMinimum"],
    ),
    "minRequest": (_profile(minRequest="lots"), [f"{PROFILE_PATH}/minRequest"]),
    "minRequest newline": (_profile(minRequest="1Gi\n"), [f"{PROFILE_PATH}/minRequest"]),
    "minRequest bytes": (_profile(minRequest=1048575), [f"{PROFILE_PATH}/minRequest"]),
    "minRequest fraction": (_profile(minRequest=1048576.5), [f"{PROFILE_PATH}/minRequest"]),
    "defaultLimit": (_profile(defaultLimit="2 GB"), [f"{PROFILE_PATH}/defaultLimit"]),
    "placement.mode": (
        _profile(placement={"mode": "always"}),
        [f"{PROFILE_PATH}/placement/mode", "'required', 'preferred', 'none'"],
    ),
    "placement.weight": (_profile(placement={"weight": 101}), [f"{PROFILE_PATH}/placement/weight"]),
    "placement.swapBacking": (
        _profile(placement={"swapBacking": "preferred"}),
        [f"{PROFILE_PATH}/placement/swapBacking", "'required', 'off'"],
    ),
    "placement typo": (
        _profile(placement={"nodeSelectors": {}}),
        [f"{PROFILE_PATH}/placement", "'nodeSelectors' not allowed"],
    ),
    "guaranteedPods": (
        _profile(guaranteedPods="always"),
        [f"{PROFILE_PATH}/guaranteedPods", "'convert', 'skip'"],
    ),
    "vpaPods": (
        _profile(vpaPods="raise"),
        [f"{PROFILE_PATH}/vpaPods", "'skip', 'raiseLimit'"],
    ),
    "resizePolicy": (
        _profile(resizePolicy="NotRequired"),
        [f"{PROFILE_PATH}/resizePolicy", "'RestartContainer', 'keep'"],
    ),
    "profile typo": (_profile(swapratio=2), [PROFILE_PATH, "'swapratio' not allowed"]),
    "podSelector typo": (
        _profile(podSelector={"matchLabel": {}}),
        [f"{PROFILE_PATH}/podSelector", "'matchLabel' not allowed"],
    ),
    "profile name": ({"policy": {"profiles": {"Sandbox_1": {}}}}, ["Sandbox_1", "pattern"]),
    "profile name too long": ({"policy": {"profiles": {"a" * 64: {}}}}, ["a" * 64]),
    "no profiles": (
        {"policy": {"profiles": {"default": None}}},
        ["/policy/profiles", "minProperties"],
    ),
    "namespace override": (
        {"policy": {"namespaces": {"team-a": {"requestRatio": 2}}}},
        ["/policy/namespaces/team-a/requestRatio"],
    ),
    "namespace both ratios": (
        {"policy": {"namespaces": {"team-a": {"requestRatio": 0.5, "swapRatio": 1}}}},
        ["policy.namespaces.team-a: give swapRatio or requestRatio, not both"],
    ),
    "policy typo": ({"policy": {"profile": {}}}, ["/policy", "'profile' not allowed"]),
    "top-level typo": ({"webhooks": {}}, ["'webhooks' not allowed"]),
    "replicas": ({"replicaCount": -1}, ["/replicaCount"]),
    "digest": ({"image": {"digest": "latest"}}, ["/image/digest"]),
}


@pytest.mark.parametrize("case", REJECTED)
def test_bad_values_are_refused(chart: Chart, case: str) -> None:
    values, expected = REJECTED[case]
    err = chart.error(values)
    for text in expected:
        assert text in err, f"{case}: {text!r} not in:\n{err}"
