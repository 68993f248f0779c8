"""README "Policy reference": the policy file is validated with field paths; typos are never
ignored."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.policy import PolicyError, build_policy, default_policy, load_policy, parse_policy

HEADER = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy"}
MI = 1024 * 1024

SPEC_EXAMPLE = """
apiVersion: swapwise.io/v1alpha1
kind: SwapPolicy
profiles:
  sandbox:
    swapRatio: 2
    minRequest: 64Mi
    maxLimitRequestRatio: 8
    defaultLimit: 2Gi
    guaranteedPods: convert
    resizePolicy: RestartContainer
    podSelector:
      matchLabels: {app.kubernetes.io/component: sandbox}
    placement:
      mode: required
      nodeSelector: {swapwise.io/swap-node: "true"}
      weight: 100
      tolerations: []
namespaces:
  team-a: {requestRatio: 0.25}
"""


def errors_of(document: Any) -> list[str]:
    with pytest.raises(PolicyError) as info:
        build_policy(document)
    return info.value.errors


def with_profile(**fields: Any) -> dict[str, Any]:
    return {**HEADER, "profiles": {"p": fields}}


def test_spec_example_compiles() -> None:
    policy = parse_policy(SPEC_EXAMPLE)
    sandbox = policy.resolve("sandbox")
    assert sandbox is not None
    assert sandbox.request_ratio == Fraction(1, 3)
    assert sandbox.min_request == 64 * MI
    assert sandbox.max_limit_request_ratio == 8
    assert sandbox.default_limit == 2048 * MI
    assert sandbox.pod_selector is not None
    assert sandbox.pod_selector.matches({"app.kubernetes.io/component": "sandbox"})
    team_a = policy.resolve("sandbox", "team-a")
    assert team_a is not None and team_a.request_ratio == Fraction(1, 4)
    assert team_a.min_request == 64 * MI  # other fields come from the profile
    assert policy.resolve("sandbox", "team-b") == sandbox
    assert policy.resolve("nope") is None


def test_default_policy() -> None:
    policy = default_policy()
    assert list(policy.profiles) == ["default"]
    profile = policy.profiles["default"]
    assert profile.request_ratio == Fraction(1, 3)
    assert profile.min_request == 16 * MI
    assert profile.max_limit_request_ratio is None and profile.default_limit is None
    assert profile.guaranteed_pods == "convert" and profile.resize_policy == "RestartContainer"
    assert profile.placement.mode == "required" and profile.placement.weight == 100
    assert profile.placement.node_selector == (("swapwise.io/swap-node", "true"),)
    assert profile.placement.swap_backing == "required"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"swapRatio": 2, "requestRatio": 0.3}, "profiles.p: give swapRatio or requestRatio"),
        ({"swapRaito": 2}, "profiles.p.swapRaito: unknown field"),
        ({"placement": {"mdoe": "required"}}, "profiles.p.placement.mdoe: unknown field"),
        ({"swapRatio": 0}, "profiles.p.swapRatio: Input should be greater than 0"),
        ({"swapRatio": -1}, "profiles.p.swapRatio: Input should be greater than 0"),
        ({"requestRatio": 1}, "profiles.p.requestRatio: Input should be less than 1"),
        ({"requestRatio": 0}, "profiles.p.requestRatio: Input should be greater than 0"),
        ({"requestRatio": "0.3"}, "profiles.p.requestRatio"),
        ({"maxLimitRequestRatio": 1}, "profiles.p.maxLimitRequestRatio: Input should be greater"),
        ({"minRequest": "64MB"}, "profiles.p.minRequest: '64MB' is not a valid quantity"),
        ({"minRequest": "0"}, "profiles.p.minRequest: '0' must be greater than zero"),
        ({"defaultLimit": "lots"}, "profiles.p.defaultLimit: 'lots' is not a valid quantity"),
        ({"defaultLimit": "8Mi"}, "profiles.p: defaultLimit must be greater than minRequest"),
        ({"guaranteedPods": "Convert"}, "profiles.p.guaranteedPods: Input should be 'convert'"),
        ({"resizePolicy": "NotRequired"}, "profiles.p.resizePolicy: Input should be"),
        ({"placement": {"mode": "always"}}, "profiles.p.placement.mode: Input should be"),
        ({"placement": {"weight": 0}}, "profiles.p.placement.weight: Input should be greater"),
        ({"placement": {"weight": 101}}, "profiles.p.placement.weight: Input should be less"),
        ({"placement": {"swapBacking": "preferred"}},
         "profiles.p.placement.swapBacking: Input should be 'required' or 'off'"),
        ({"placement": {"swapBacking": False}},  # YAML's `off` unquoted is a boolean
         "profiles.p.placement.swapBacking: false is not 'required' or 'off': YAML reads an "
         "unquoted off (or no, false) as a boolean; write 'off' in quotes"),
        ({"placement": {"swapbacking": "off"}}, "profiles.p.placement.swapbacking: unknown field"),
        ({"placement": {"nodeSelector": {"swap": True}}},
         "profiles.p.placement.nodeSelector.swap: Input should be a valid string"),
        ({"placement": {"tolerations": [{"key": "a", "operator": "Maybe"}]}},
         "profiles.p.placement.tolerations.0.operator"),
        ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
         "profiles.p.podSelector.matchExpressions.0: operator In needs at least one value"),
        ({"podSelector": {"matchLabel": {}}}, "profiles.p.podSelector.matchLabel: unknown field"),
    ],
)
def test_invalid_profiles_are_refused_with_the_field_path(
    fields: dict[str, Any], expected: str
) -> None:
    errors = errors_of(with_profile(**fields))
    assert any(e.startswith(expected) for e in errors), errors


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({"kind": "SwapPolicy", "profiles": {"p": {}}}, "apiVersion: Field required"),
        ({**HEADER, "apiVersion": "v1"}, "apiVersion: Input should be 'swapwise.io/v1alpha1'"),
        ({**HEADER, "profiles": {}}, "profiles: Dictionary should have at least 1 item"),
        ({**HEADER, "profiles": {"Sandbox": {}}}, "profiles.Sandbox.[key]: 'Sandbox' is not a DNS"),
        ({**HEADER, "profiles": {"p": {}}, "extra": 1}, "extra: unknown field"),
        ({**HEADER, "profiles": {"p": {}}, "namespaces": {"team-a": {"swapRatoi": 1}}},
         "namespaces.team-a.swapRatoi: unknown field"),
        ({**HEADER, "profiles": {"p": {}}, "namespaces": {"team-a": {"requestRatio": 2}}},
         "namespaces.team-a.requestRatio: Input should be less than 1"),
        ([], "(root): the policy must be a YAML mapping"),
    ],
)
def test_invalid_documents(document: Any, expected: str) -> None:
    errors = errors_of(document)
    assert any(e.startswith(expected) for e in errors), errors


def test_every_error_is_reported_not_only_the_first() -> None:
    errors = errors_of(with_profile(swapRaito=1, minRequest="x", placement={"mode": "y"}))
    assert len(errors) == 3


def test_override_ratio_replaces_the_other_spelling() -> None:
    policy = build_policy({**HEADER, "profiles": {"p": {"requestRatio": 0.5}},
                           "namespaces": {"a": {"swapRatio": 3}, "b": {"requestRatio": 0.2}}})
    assert policy.resolve("p", "a").request_ratio == Fraction(1, 4)  # type: ignore[union-attr]
    assert policy.resolve("p", "b").request_ratio == Fraction(1, 5)  # type: ignore[union-attr]


def test_override_merges_placement_fields() -> None:
    policy = build_policy({**HEADER, "profiles": {"p": {"placement": {"weight": 7}}},
                           "namespaces": {"a": {"placement": {"mode": "preferred"}}}})
    placement = policy.resolve("p", "a").placement  # type: ignore[union-attr]
    assert placement.mode == "preferred" and placement.weight == 7


def test_swap_backing_set_per_profile_and_per_namespace() -> None:
    policy = parse_policy(
        "apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\nprofiles:\n"
        "  p: {placement: {swapBacking: 'off'}}\n  q: {}\n"
        "namespaces:\n  a: {placement: {swapBacking: required}}\n"
        "  b: {placement: {weight: 5}}\n")
    backing = {key: profile.placement.swap_backing
               for key, profile in [*policy.profiles.items(), *policy.overrides.items()]}
    assert backing == {"p": "off", "q": "required", ("p", "a"): "required",
                       ("q", "a"): "required", ("p", "b"): "off", ("q", "b"): "required"}
    errors = errors_of({**HEADER, "profiles": {"p": {}},
                        "namespaces": {"a": {"placement": {"swapBacking": "no"}}}})
    assert errors == ["namespaces.a.placement.swapBacking: Input should be 'required' or 'off'"]


def test_duplicate_keys_are_refused() -> None:
    text = "apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\nprofiles:\n  p: {}\n  p: {}\n"
    with pytest.raises(PolicyError, match="duplicate key 'p'"):
        parse_policy(text)


def test_invalid_yaml() -> None:
    with pytest.raises(PolicyError, match=r"\(yaml\)"):
        parse_policy("profiles: [")


def test_load_policy_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the policy file") as info:
        load_policy(tmp_path / "nope.yaml")
    assert info.value.errors == ["(file): No such file or directory"]


def test_load_policy_from_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**HEADER, "profiles": {"a": {}, "b": {"swapRatio": 1}}}))
    policy = load_policy(path)
    assert sorted(policy.profiles) == ["a", "b"]
    assert policy.profiles["b"].request_ratio == Fraction(1, 2)
    assert policy.source == str(path)


# ------------------------------------------------------------ errors that help (issue 29)

def policy_text(profile: str) -> str:
    """A policy whose profile ``p`` is the YAML flow mapping ``profile``."""
    return f"apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\nprofiles:\n  p: {profile}\n"


def text_errors(text: str) -> list[str]:
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "p.yaml")
    return info.value.errors


@pytest.mark.parametrize(("profile", "errors"), [
    # was "(root): cannot be read as a policy: OverflowError"
    ("{swapRatio: .inf}", ["profiles.p.swapRatio: must be a finite number, not .inf"]),
    ("{requestRatio: .nan}", ["profiles.p.requestRatio: must be a finite number, not .nan"]),
    # YAML 1.1 reads 1.0e300 as text; was "valid integer" and "valid number" on two lines
    ("{swapRatio: 1.0e300}", ["profiles.p.swapRatio: '1.0e300' is text, not a number: YAML "
                              "reads an exponent only with a dot and a sign; write 1.0e+300"]),
    ('{requestRatio: "0.3"}', ["profiles.p.requestRatio: '0.3' is text, not a number: write it "
                               "without quotes"]),
    ("{swapRatio: [2]}", ["profiles.p.swapRatio: must be a number, not a list"]),
    ("{placement: {weight: 5.5}}", ["profiles.p.placement.weight: must be a whole number, "
                                    "not 5.5"]),
    ("{minRequest: null}", ["profiles.p.minRequest: must be a quantity (e.g. 64Mi, 2Gi or a "
                            "number of bytes), not null"]),
    # was accepted by policy check, clamped to 2^63-1, then refused by render
    ("{defaultLimit: 8Ei}", ["profiles.p.defaultLimit: '8Ei' is too large: memory quantities "
                             "here must be below 4Ei (beyond, 64-bit arithmetic is no longer "
                             "exact)"]),
    # bytes: was accepted without a word, and never changes a result (requests are whole MiB)
    ("{minRequest: 64}", ["profiles.p.minRequest: 64 is 64 bytes, below 1Mi: the engine writes "
                          "whole MiB, so it would never change anything (a quantity without a "
                          "suffix is bytes: did you mean 64Mi?)"]),
    ("{minRequest: 64k}", ["profiles.p.minRequest: '64k' is 64000 bytes, below 1Mi: the engine "
                           "writes whole MiB, so it would never change anything"]),
    # was "Input should be a valid dictionary or instance of ProfileSpec"
    ("null", ["profiles.p: must be a mapping of fields, not null (write {} for every default)"]),
    ("{swapRaito: 2}", ["profiles.p.swapRaito: unknown field: did you mean swapRatio? (unknown "
                        "fields are never ignored)"]),
    ("{placement: {tolerations: [{kye: a, operator: Exists}]}}", [
        "profiles.p.placement.tolerations.0.kye: unknown field: did you mean key? (unknown "
        "fields are never ignored)"]),
    ("{podSelector: {matchExpresions: []}}", [
        "profiles.p.podSelector.matchExpresions: unknown field: did you mean matchExpressions? "
        "(unknown fields are never ignored)"]),
    ("{zzz: 1}", ["profiles.p.zzz: unknown field (check the spelling: unknown fields are never "
                  "ignored)"]),
])
def test_errors_say_what_is_wrong_and_how_to_write_it(profile: str, errors: list[str]) -> None:
    assert text_errors(policy_text(profile)) == errors


def test_a_typo_in_a_namespace_override_gets_a_suggestion_too() -> None:
    errors = text_errors(policy_text("{}") + "namespaces:\n  team-a: {requestRaito: 0.5}\n")
    assert errors == ["namespaces.team-a.requestRaito: unknown field: did you mean requestRatio? "
                      "(unknown fields are never ignored)"]


def test_the_smallest_and_largest_memory_quantities_are_accepted() -> None:
    policy = parse_policy(policy_text("{minRequest: 1Mi, defaultLimit: 4194303Ti}"))
    assert policy.profiles["p"].min_request == MI
    assert policy.profiles["p"].default_limit == 2**62 - 2**40


def test_yaml_errors_name_the_file_line_and_column() -> None:
    [error] = text_errors(policy_text("{a: [}"))
    assert error == ("(yaml): line 4, column 11: while parsing a flow node, expected the node "
                     "content, but found '}'")
    with pytest.raises(PolicyError) as info:
        parse_policy(policy_text("{a: [}"), "p.yaml")
    assert str(info.value).startswith("p.yaml: invalid policy:")
    assert "<unicode string>" not in str(info.value)


def test_a_file_that_cannot_be_read_is_said_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path / "nope.yaml")
    assert str(info.value) == f"{tmp_path / 'nope.yaml'}: cannot read the policy file: No such " \
                              "file or directory"
    with pytest.raises(PolicyError) as info:
        load_policy(tmp_path)
    assert str(info.value) == f"{tmp_path}: cannot read the policy file: not a regular file"


# Label keys and values as the API server checks them, with the labeller's own checker
# (webhook.base.labels): the loader took an empty key, and values the API server refuses.
BAD_VALUE = ("is not a label value the API server accepts: the value must be empty or 1-63 "
             "characters [A-Za-z0-9-_.], starting and ending alphanumeric")
BAD_KEY = ("is not a label key the API server accepts: the key name must be 1-63 characters "
           "[A-Za-z0-9-_.], starting and ending alphanumeric")


@pytest.mark.parametrize(("fields", "error"), [
    ({"podSelector": {"matchLabels": {"": "x"}}},
     f'profiles.p.podSelector.matchLabels."".[key]: \'\' {BAD_KEY}'),
    ({"podSelector": {"matchLabels": {"app": "\U0001F600"}}},
     f"profiles.p.podSelector.matchLabels.app: '\U0001F600' {BAD_VALUE}"),
    ({"podSelector": {"matchLabels": {"app": "v" * 64}}},
     f"profiles.p.podSelector.matchLabels.app: '{'v' * 64}' {BAD_VALUE}"),
    ({"podSelector": {"matchLabels": {"app": "sandbox\n"}}},
     f"profiles.p.podSelector.matchLabels.app: 'sandbox\\n' {BAD_VALUE}"),
    ({"podSelector": {"matchExpressions": [{"key": "a b", "operator": "Exists"}]}},
     f"profiles.p.podSelector.matchExpressions.0.key: 'a b' {BAD_KEY}"),
    ({"podSelector": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["-x"]}]}},
     f"profiles.p.podSelector.matchExpressions.0.values.0: '-x' {BAD_VALUE}"),
    ({"placement": {"nodeSelector": {"Example.com/swap": "true"}}},
     "profiles.p.placement.nodeSelector.Example.com/swap.[key]: 'Example.com/swap' is not a "
     "label key the API server accepts: the key prefix must be a DNS subdomain"),
    ({"placement": {"tolerations": [{"key": "swap", "value": "a b"}]}},
     f"profiles.p.placement.tolerations.0.value: 'a b' {BAD_VALUE}"),
    ({"placement": {"tolerations": [{"key": "/swap", "operator": "Exists"}]}},
     "profiles.p.placement.tolerations.0.key: '/swap' is not a label key the API server "
     "accepts: the key prefix must be a DNS subdomain"),
])
def test_label_keys_and_values_the_api_server_refuses_are_refused(
        fields: dict[str, Any], error: str) -> None:
    assert errors_of(with_profile(**fields)) == [error]


def test_label_keys_and_values_the_api_server_accepts_are_accepted() -> None:
    build_policy(with_profile(
        podSelector={"matchLabels": {"app.kubernetes.io/component": "", "a": "A-b_c.9"},
                     "matchExpressions": [{"key": "x", "operator": "In", "values": [""]}]},
        placement={"nodeSelector": {"example.com/swap": "true"},
                   "tolerations": [{"operator": "Exists"}, {"key": "", "operator": "Exists"},
                                   {"key": "swap", "value": "true"}]}))
