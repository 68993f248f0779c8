"""The admission-policy renderer's shape: objects, selectors, refusals, the CLI.

What the CEL computes is proven against the webhook on a real API server
(tests/e2e/test_admission_policy.py); these check what can be checked without one.
"""

from __future__ import annotations

import json
import random
import string
import subprocess
from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml

from testkit.server_proc import SWAPWISE
from webhook.engine import warnings as warnings_module
from webhook.engine.backing import PERMILLE_LABEL, container_need
from webhook.engine.mutate import backing_warning
from webhook.engine.pressure import MARKS
from webhook.policy import Policy, build_policy, default_policy
from webhook.profile import LabelSelector, Profile
from webhook.render.admission_policy import (
    Unrenderable,
    fmt,
    helm_values,
    lit,
    need_cel,
    q,
    render_admission_policies,
)

KINDS = ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def policy(profiles: dict[str, Any], namespaces: dict[str, Any] | None = None) -> Any:
    document: dict[str, Any] = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                "profiles": profiles}
    if namespaces:
        document["namespaces"] = namespaces
    return build_policy(document)


def test_default_policy_renders_four_objects_bound_by_the_profile_label() -> None:
    objects = render_admission_policies(default_policy())
    assert [o["kind"] for o in objects] == KINDS
    assert objects[0]["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert objects[0]["metadata"]["name"] == "swapwise-default"
    assert objects[1]["spec"]["policyName"] == "swapwise-default"
    selector = objects[1]["spec"]["matchResources"]["namespaceSelector"]
    assert selector == {"matchExpressions": [
        {"key": "swapwise.io/profile", "operator": "In", "values": ["default"]},
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
         "values": ["kube-node-lease", "kube-system"]},
    ]}
    assert objects[3]["spec"]["validationActions"] == ["Warn"]
    assert objects[0]["spec"]["reinvocationPolicy"] == "IfNeeded"
    assert objects[0]["spec"]["failurePolicy"] == "Ignore"
    assert objects[0]["spec"]["mutations"][0]["patchType"] == "JSONPatch"


def test_v1beta1_for_clusters_before_1_36() -> None:
    objects = render_admission_policies(default_policy(), api_version="v1beta1")
    assert [o["apiVersion"].rsplit("/", 1)[1] for o in objects] == \
        ["v1beta1", "v1beta1", "v1", "v1"]
    with pytest.raises(ValueError):
        render_admission_policies(default_policy(), api_version="v2")


def test_profile_values_are_written_into_the_cel() -> None:
    objects = render_admission_policies(policy({"big": {"minRequest": "64Mi",
                                                        "defaultLimit": "2Gi"}}))
    text = yaml.safe_dump(objects[0])
    assert str(64 * 1024 * 1024) in text  # minRequest
    assert "'2Gi'" in text or '"2Gi"' in text  # defaultLimit, canonical


def test_namespace_overrides_get_their_own_policy_and_the_base_skips_them() -> None:
    objects = render_admission_policies(policy({"sandbox": {}},
                                               {"team-a": {"requestRatio": 0.25}}))
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "MutatingAdmissionPolicy"]
    assert names == ["swapwise-sandbox", "swapwise-sandbox-ns-team-a"]
    base, override = (o["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
                      for o in objects if o["kind"] == "MutatingAdmissionPolicyBinding")
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-node-lease", "kube-system", "team-a"]} in base
    assert {"key": "kubernetes.io/metadata.name", "operator": "In",
            "values": ["team-a"]} in override


def test_pod_selector_and_guaranteed_skip_become_match_conditions() -> None:
    objects = render_admission_policies(policy({"p": {
        "guaranteedPods": "skip", "podSelector": {"matchLabels": {"app": "x"}}}}))
    names = [c["name"] for c in objects[0]["spec"]["matchConditions"]]
    assert names == ["not-opted-out", "not-critical", "not-windows", "not-too-large",
                     "pod-selector", "not-guaranteed"]
    # the warning policy applies to exactly the same pods
    assert objects[2]["spec"]["matchConditions"] == objects[0]["spec"]["matchConditions"]


def test_ratio_cel_cannot_compute_exactly_is_refused_naming_the_field() -> None:
    with pytest.raises(Unrenderable) as caught:
        render_admission_policies(policy({"ok": {}, "fine": {"requestRatio": 0.1234567891}}))
    assert caught.value.errors == [
        "profiles.fine.requestRatio/swapRatio: 0.123457 has too many digits to be computed "
        "exactly with CEL's 64-bit integers; round it"]


def test_cel_literals() -> None:
    assert lit({"key": "a", "tolerationSeconds": 30, "values": ["x"]}) == \
        '{"key": dyn("a"), "tolerationSeconds": dyn(30), "values": dyn([dyn("x")])}'
    assert "'Gi'" not in fmt("t") and '"Gi"' in fmt("t")


def swapwise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SWAPWISE, *args], capture_output=True, text=True, timeout=60)


def test_cli_renders_yaml_documents(tmp_path: Path) -> None:
    out = swapwise("render", "admission-policy")
    assert out.returncode == 0, out.stderr
    assert [d["kind"] for d in yaml.safe_load_all(out.stdout)] == KINDS


def test_cli_refuses_with_the_field_and_prints_nothing(tmp_path: Path) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                    "profiles": {"x": {"maxLimitRequestRatio": 1.0000001}}}))
    out = swapwise("render", "admission-policy", "--policy", str(file))
    assert out.returncode == 1
    assert out.stdout == ""
    assert "profiles.x.maxLimitRequestRatio" in out.stderr


def test_helm_values_are_the_chart_mode_and_the_objects() -> None:
    objects = render_admission_policies(default_policy())
    assert helm_values(objects) == {"mode": "admissionPolicy",
                                    "admissionPolicy": {"objects": objects}}


def test_cli_helm_values_hold_the_same_objects_as_data(tmp_path: Path) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                    "profiles": {"a": {}, "b": {"swapRatio": 3}}}))
    args = ("render", "admission-policy", "--policy", str(file), "--api-version", "v1beta1",
            "--failure-policy", "Fail", "--exclude-namespace", "infra")
    plain = swapwise(*args)
    values = swapwise(*args, "--format", "helm-values")
    assert plain.returncode == values.returncode == 0, plain.stderr + values.stderr
    loaded = yaml.safe_load(values.stdout)
    assert set(loaded) == {"mode", "admissionPolicy"}
    assert loaded["mode"] == "admissionPolicy"
    # A list of objects (not a string), exactly what the plain form prints.
    assert loaded["admissionPolicy"]["objects"] == list(yaml.safe_load_all(plain.stdout))
    assert len(loaded["admissionPolicy"]["objects"]) == 8
    # Readable and diffable: a comment saying what it is, no YAML anchors, same bytes twice.
    assert values.stdout.startswith("# swapwise: values for charts/swapwise in mode "
                                    "admissionPolicy")
    assert "helm upgrade --install swapwise charts/swapwise" in values.stdout
    assert "&id" not in values.stdout and "*id" not in values.stdout
    assert swapwise(*args, "--format", "helm-values").stdout == values.stdout


def test_cli_helm_values_refuses_like_the_plain_form(tmp_path: Path) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                    "profiles": {"x": {"maxLimitRequestRatio": 1.0000001}}}))
    out = swapwise("render", "admission-policy", "--policy", str(file), "--format",
                   "helm-values")
    assert out.returncode == 1
    assert out.stdout == ""
    assert "profiles.x.maxLimitRequestRatio" in out.stderr
    bad = swapwise("render", "admission-policy", "--format", "json")
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# --------------------------------------------------------------------------- swap backing

INT64 = 2**63 - 1


def _need_pairs() -> list[tuple[int, int]]:
    """(request, limit) pairs at the edges of int64 and of the rounding, and a spread."""
    pairs = [(1, 2), (1, 1001), (3, 10), (1000, 1001), (1001, 1002), (683 * 2**20, 2**31),
             (86 * 2**20, 256 * 2**20), (2**20, 1000 * 2**20),
             # 1000 x excess beyond int64; a double's quotient rounds up to a whole number
             (2690150177416675328, 7 * 2**60), (INT64 - 1, INT64), (2**62, INT64),
             (2**53 + 1, 2**54), (9223372036854775, INT64), (9223372036854776, INT64),
             (INT64 // 3, INT64), (INT64 // 1001, INT64 // 1001 * 1001 + 1)]
    rng = random.Random(25)
    for _ in range(150):
        limit = rng.choice([rng.randint(2, 2**30), rng.randint(2, 2**50), rng.randint(2, INT64)])
        low = max(1, limit // rng.choice([2, 3, 10, 1000, 10**6]))
        pairs.append((rng.randint(low, limit - 1) if limit > low else 1, limit))
    return pairs


def test_need_in_cel_is_the_engines_for_every_int64() -> None:
    """CEL's ints are 64-bit and overflow is an error (celpy checks it like cel-go does):
    the rendered need must equal container_need's, with no intermediate overflow."""
    env = celpy.Environment()
    program = env.program(env.compile(need_cel("r", "l")))
    wrong = []
    for request, limit in _need_pairs():
        try:
            got: Any = int(program.evaluate({"r": celpy.celtypes.IntType(request),
                                             "l": celpy.celtypes.IntType(limit)}))
        except celpy.CELEvalError as exc:
            got = exc
        if got != container_need(request, limit):
            wrong.append((request, limit, got, container_need(request, limit)))
    assert wrong == []


def _variables(obj: dict[str, Any]) -> dict[str, str]:
    return {v["name"]: v["expression"] for v in obj["spec"]["variables"]}


@pytest.mark.parametrize(
    ("placement", "backed"),
    [({}, True), ({"nodeSelector": {}}, True), ({"swapBacking": "off"}, False),
     ({"mode": "preferred"}, False), ({"mode": "none"}, False)],
)
def test_backing_is_rendered_only_with_required_placement(
    placement: dict[str, Any], backed: bool
) -> None:
    mutating, _, validating, _ = render_admission_policies(policy({"p": {"placement":
                                                                           placement}}))
    assert ("need" in _variables(mutating)) is backed
    assert (PERMILLE_LABEL in json.dumps(mutating)) is backed
    assert ("backingNeed" in _variables(validating)) is backed
    before, _, after = backing_warning(1977).removeprefix("swapwise: ").partition("1977")
    assert (json.dumps(before) in _variables(validating)["msgs"]) is backed
    assert (json.dumps(after) in _variables(validating)["msgs"]) is backed


def test_namespace_override_of_swap_backing_renders_its_own_policy() -> None:
    objects = render_admission_policies(policy(
        {"p": {}}, {"legacy": {"placement": {"swapBacking": "off"}}}))
    mutating = {o["metadata"]["name"]: o for o in objects
                if o["kind"] == "MutatingAdmissionPolicy"}
    assert "need" in _variables(mutating["swapwise-p"])
    assert "need" not in _variables(mutating["swapwise-p-ns-legacy"])


@pytest.mark.parametrize(
    ("placement", "guarded"),
    [({}, True), ({"nodeSelector": {}}, True), ({"swapBacking": "off"}, True),
     ({"nodeSelector": {}, "swapBacking": "off"}, True),
     ({"mode": "preferred"}, False), ({"mode": "preferred", "nodeSelector": {}}, False),
     ({"mode": "none"}, False)],
)
def test_pressure_entry_is_rendered_only_with_required_placement(
    placement: dict[str, Any], guarded: bool
) -> None:
    """docs/rules.md "The pressure marks": required placement adds an entry per mark (with
    an empty nodeSelector and without backing too), checked per term by key and operator;
    preferred and none never do. Its effect on pods: tests/e2e/test_admission_policy.py."""
    mutating, _, validating, _ = render_admission_policies(policy({"p": {"placement":
                                                                           placement}}))
    core = _variables(mutating)["core"]
    for mark in MARKS:
        entry = f'{{"key": dyn({json.dumps(mark.key)}), "operator": dyn("DoesNotExist")}}'
        assert (entry in core) is guarded
        # the "already there" test of a term compares the key and the operator, not values
        present = f"e.key == {json.dumps(mark.key)} && e.operator == \"DoesNotExist\")"
        assert (present in core) is guarded
        assert mark.key not in json.dumps(validating)  # no warning of its own


@pytest.mark.parametrize("count", [0, 1, 16, 17, 18, 40])
def test_warning_slots_show_every_message_up_to_17_then_count_the_rest(count: int) -> None:
    """One Warn validation per slot: a slot warns (its message) when its expression is false."""
    validating = render_admission_policies(default_policy())[2]
    env = celpy.Environment()
    msgs = [f"swapwise: m{i}" for i in range(count)]
    activation = {"variables": celpy.json_to_cel({"msgs": msgs})}
    shown = []
    for slot in validating["spec"]["validations"]:
        if not env.program(env.compile(slot["expression"])).evaluate(activation):
            shown.append(str(env.program(env.compile(slot["messageExpression"]))
                             .evaluate(activation)))
    assert shown == (msgs if count <= 17 else
                     [*msgs[:16], f"swapwise: {count - 16} more warnings"])


# ------------------------------------------------- what the API server would refuse (issue 29)

@pytest.mark.parametrize("text", ["\U0001F600", "team-\U0001F600-\u00e9", 'a"b\\c', "x\ny\x00",
                                  "\u2030 \U0010FFFF"])
def test_string_literals_are_escaped_as_cel_reads_them(text: str) -> None:
    """Outside the BMP, CEL needs \\U00xxxxxx: JSON's surrogate pair ("\\ud83d\\ude00")
    is two invalid code points to cel-go, which refuses the whole expression."""
    literal = q(text)
    assert "\\ud8" not in literal.lower() and "\\udc" not in literal.lower()
    assert literal.isascii()
    env = celpy.Environment()
    assert str(env.program(env.compile(literal)).evaluate({})) == text
    assert q("\U0001F600") == '"\\U0001f600"'


def test_a_selector_value_beyond_the_bmp_is_written_with_a_cel_escape() -> None:
    # The policy loader refuses such a label value (the API server would too); a profile
    # built otherwise still renders what cel-go accepts.
    profile = Profile(name="p", pod_selector=LabelSelector(match_labels=(("app", "\U0001F600"),)))
    objects = render_admission_policies(Policy(profiles={"p": profile}))
    [condition] = [c for c in objects[0]["spec"]["matchConditions"] if c["name"] == "pod-selector"]
    assert '== "\\U0001f600")' in condition["expression"]
    assert "\\ud83d" not in condition["expression"]


BIG_SELECTOR = {"matchExpressions": [
    {"key": f"k{i}", "operator": "In", "values": [f"v{j}" for j in range(50)]}
    for i in range(300)]}


def test_an_expression_over_cel_length_limit_is_refused_naming_the_profile() -> None:
    with pytest.raises(Unrenderable) as caught:
        render_admission_policies(policy({"small": {}, "big": {"podSelector": BIG_SELECTOR}}))
    errors = caught.value.errors
    assert len(errors) == 2, errors  # the mutating and the warning policy
    assert errors[0].startswith(
        "profiles.big: MutatingAdmissionPolicy swapwise-big spec.matchConditions[4].expression "
        "would be ")
    assert errors[0].endswith(" characters of CEL, over the 100,000 the API server accepts: "
                              "its podSelector is too large; select on fewer label values")
    assert errors[1].startswith("profiles.big: ValidatingAdmissionPolicy swapwise-big-warn ")
    # Just under the limit is rendered.
    fewer = {"matchExpressions": BIG_SELECTOR["matchExpressions"][:140]}
    objects = render_admission_policies(policy({"big": {"podSelector": fewer}}))
    longest = max(len(c["expression"]) for c in objects[0]["spec"]["matchConditions"])
    assert 90_000 < longest <= 100_000


def test_cli_refuses_a_too_long_expression_and_prints_nothing(tmp_path: Path) -> None:
    file = tmp_path / "policy.yaml"
    file.write_text(yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                                    "profiles": {"big": {"podSelector": BIG_SELECTOR}}}))
    out = swapwise("render", "admission-policy", "--policy", str(file))
    assert (out.returncode, out.stdout) == (1, "")
    assert "profiles.big: MutatingAdmissionPolicy swapwise-big" in out.stderr


@pytest.mark.parametrize("template", [
    warnings_module.LIMIT_ADDED, warnings_module.LIMIT_RAISED, warnings_module.REQUEST_LOWERED,
    warnings_module.REQUEST_NOT_BELOW, warnings_module.LIMIT_NOT_ABOVE,
    warnings_module.VPA_RAN_AFTER, warnings_module.VPA_SKIP,
])
def test_a_warning_template_reads_the_same_in_cel_as_in_python(template: str) -> None:
    """The rendered warning policy builds each warning with cel_format from the engine's
    own template: evaluated, it is the text the engine writes with str.format."""
    values = {"name": "web-1", "limit": "2Gi", "request": "683Mi", "raised": "6Gi",
              "before": "2Gi"}
    names = [field for _, field, _, _ in string.Formatter().parse(template) if field]
    expression = warnings_module.cel_format(
        template, **{name: f"values.{name}" for name in names})
    env = celpy.Environment()
    got = env.program(env.compile(expression)).evaluate(
        {"values": celpy.json_to_cel(values)})
    assert str(got) == template.format(**values)
