"""The chart's profile schema says what the policy model (``ProfileSpec``) says, both ways.

values.schema.json states a profile's fields so that `helm install` refuses a bad value
before anything runs; webhook/policy.py (pydantic) is what `swapwise policy check` and the
server refuse. One contract, stated twice: here the model's JSON schema is the source, and
every property of the chart's (names, additionalProperties, required, type, numeric bounds,
enum) is compared with it; then every bound is probed on both sides, through the chart's
schema and through the policy check, which must agree. Changing either side alone fails here.

JSON Schema cannot state everything the model checks. The templates check swapRatio
beside requestRatio (test_chart_schema.py); quantities are tested below against the
quantity grammar. Left to the policy check alone: a quantity string's value (below 1Mi,
or from 4Ei), label key and value syntax, defaultLimit above minRequest, and a
toleration's or a selector requirement's fields together.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from chartlib import CHART

from webhook.policy import MAX_MEMORY, MIN_MEMORY, PolicyError, ProfileSpec, build_policy


def _go_pattern(validator: Any, pattern: str, instance: Any, schema: Any
                ) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` as Helm's validator reads it, with Go's regexp: there ``$`` is the end
    of the text, where Python's also matches before a final newline."""
    if validator.is_type(instance, "string") and \
            not re.search(pattern.replace("$", r"\Z"), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = jsonschema.validators.extend(jsonschema.Draft7Validator, {"pattern": _go_pattern})(
    SCHEMA)
MODEL = ProfileSpec.model_json_schema()
BOUNDS = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
# pydantic writes a bound on a union (StrictInt | StrictFloat) with its own keywords
PYDANTIC_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum",
                   "lt": "exclusiveMaximum"}
Path = tuple[str, ...]  # property names; "*" a map's value, "[]" an array's item


def _resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its ``$ref`` (``#/$defs/X`` or ``#/definitions/X``) followed."""
    while "$ref" in node:
        *_, section, name = node["$ref"].split("/")
        node = {**root[section][name], **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def _branches(node: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a node, nested anyOf/oneOf flattened, ``null`` dropped: Helm
    reads a null value as "remove this key", which the model reads as its default."""
    node = _resolve(node, root)
    alternatives = node.get("anyOf") or node.get("oneOf")
    if not alternatives:
        return [] if node.get("type") == "null" else [node]
    shared = {k: v for k, v in node.items() if k not in ("anyOf", "oneOf")}
    return [b for alt in alternatives for b in _branches({**shared, **alt}, root)]


def _types(node: dict[str, Any]) -> set[str]:
    if "enum" in node:
        return {"string"}  # every enum of a profile is one of strings
    found = node.get("type", [])
    return {found} if isinstance(found, str) else set(found)


def _bounds(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: node[k] for k in BOUNDS if k in node}
    out.update({PYDANTIC_BOUNDS[k]: v for k, v in node.items() if k in PYDANTIC_BOUNDS})
    return out


def describe(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """What a schema node accepts, as far as this test compares: the JSON types (an integer
    is a number, so ``integer | number`` is ``number``), numeric bounds, enum, and, for an
    object, its properties, whether others are allowed, and which are required."""
    branches = _branches(node, root)
    types: set[str] = set().union(*(_types(b) for b in branches))
    if "number" in types:
        types.discard("integer")
    out: dict[str, Any] = {"types": types}
    bounds = [_bounds(b) for b in branches if _types(b) & {"integer", "number"}]
    if any(bounds):  # one set, or each numeric alternative's when they differ
        out["bounds"] = bounds[0] if all(b == bounds[0] for b in bounds) else bounds
    enums = [b["enum"] for b in branches if "enum" in b]
    if enums:
        out["enum"] = {v for e in enums for v in e}
    for b in branches:
        if "properties" in b:
            out["properties"] = {k: _resolve(v, root) for k, v in b["properties"].items()}
            out["closed"] = b.get("additionalProperties") is False
            out["required"] = set(b.get("required", []))
        elif isinstance(b.get("additionalProperties"), dict):
            out["values"] = b["additionalProperties"]
        if "items" in b:
            out["items"] = b["items"]
    return out


def pairs(model: dict[str, Any], chart: dict[str, Any], path: Path = ()
          ) -> Iterator[tuple[Path, dict[str, Any], dict[str, Any]]]:
    """(path, model's description, chart's description) of every node, depth first."""
    m, c = describe(model, MODEL), describe(chart, SCHEMA)
    yield path, m, c
    for key in sorted(set(m.get("properties", {})) & set(c.get("properties", {}))):
        yield from pairs(m["properties"][key], c["properties"][key], (*path, key))
    for part, field in (("*", "values"), ("[]", "items")):
        if field in m and field in c:
            yield from pairs(m[field], c[field], (*path, part))


def chart_profile() -> dict[str, Any]:
    return _resolve(SCHEMA["properties"]["policy"]["properties"]["profiles"]
                    ["additionalProperties"], SCHEMA)


NODES = list(pairs(MODEL, chart_profile()))
QUANTITIES = {path for path, m, _ in NODES if m["types"] == {"string", "integer"}}


def _name(path: Path) -> str:
    return ".".join(path) or "(profile)"


@pytest.mark.parametrize("path, model, chart", NODES, ids=[_name(p) for p, _, _ in NODES])
def test_the_chart_states_what_the_model_states(
        path: Path, model: dict[str, Any], chart: dict[str, Any]) -> None:
    assert set(chart.get("properties", {})) == set(model.get("properties", {}))
    assert chart.get("closed") == model.get("closed"), "additionalProperties: false, both"
    assert chart.get("required") == model.get("required")
    assert chart["types"] == model["types"]
    assert chart.get("enum") == model.get("enum")
    if path not in QUANTITIES:  # the model's quantity bounds are in its validator: below
        assert chart.get("bounds") == model.get("bounds")
    assert ("values" in chart) == ("values" in model) and ("items" in chart) == ("items" in model)


def test_every_profile_field_is_compared() -> None:
    """The walk reaches every field of the model (so none is compared by nobody)."""
    compared = {path for path, _, _ in NODES}
    assert {(f,) for f in ProfileSpec.model_fields} <= compared
    assert ("placement", "weight") in compared
    assert ("placement", "tolerations", "[]", "effect") in compared
    assert ("podSelector", "matchExpressions", "[]", "operator") in compared
    assert {("minRequest",), ("defaultLimit",)} == QUANTITIES


# -- both ways: the chart accepts a value exactly when the policy check does --------------


def _at(path: Path, value: Any) -> dict[str, Any]:
    """A profile with ``value`` at ``path`` (a map's value under the key ``k``)."""
    for part in reversed(path):
        value = {"k" if part == "*" else part: value}
    return value  # type: ignore[no-any-return]


def chart_accepts(profile: dict[str, Any], name: str = "default") -> bool:
    return VALUES.is_valid({"policy": {"profiles": {name: profile}}})


def policy_accepts(profile: dict[str, Any], name: str = "default") -> bool:
    document = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                "profiles": {name: profile}}
    try:
        build_policy(document)
    except PolicyError:
        return False
    return True


def _near(bound: float | int, integer: bool) -> list[float | int]:
    steps = [1] if integer else [1, 0.5, 1e-6]
    return [bound, *(bound + s for s in steps), *(bound - s for s in steps)]


def probes() -> Iterator[tuple[str, dict[str, Any]]]:
    """Values on and around every bound, of each type, every enum member and a stranger,
    at every path outside arrays (an array's items are objects whose fields depend on each
    other: the comparison above covers them)."""
    for path, model, chart in NODES:
        if "[]" in path or path in QUANTITIES or "properties" in model:
            continue
        values: list[Any] = [True, "x", [], {}]
        for bounds in (model.get("bounds", {}), chart.get("bounds", {})):
            for bound in bounds.values():
                values += _near(bound, model["types"] == {"integer"})
        values += [*sorted(model.get("enum", ())), *sorted(chart.get("enum", ())), "never"]
        for value in values:
            yield f"{_name(path)}={value!r}", _at(path, value)


PROBES = dict(probes())


@pytest.mark.parametrize("probe", PROBES)
def test_chart_and_policy_check_agree(probe: str) -> None:
    profile = PROBES[probe]
    assert chart_accepts(profile) == policy_accepts(profile), (
        f"{profile}: the chart {'accepts' if chart_accepts(profile) else 'refuses'} it, "
        f"the policy check {'accepts' if policy_accepts(profile) else 'refuses'} it")


def test_the_probes_see_both_answers() -> None:
    """Not vacuous: values on each side of the bounds, accepted and refused."""
    answers = [policy_accepts(p) for p in PROBES.values()]
    assert answers.count(True) > 20 and answers.count(False) > 50
    assert "requestRatio=1" in PROBES and "maxLimitRequestRatio=1" in PROBES


@pytest.mark.parametrize("name", ["a", "sandbox-2", "a" * 63, "a" * 64, "A", "-a", "a-",
                                  "a_b", "a.b", ""])
def test_profile_names_agree(name: str) -> None:
    assert chart_accepts({}, name) == policy_accepts({}, name)


# -- quantities: the grammar, and whole bytes from 1Mi to below 4Ei ----------------------


def _quantities() -> list[tuple[str, bool]]:
    """(text, whether Kubernetes parses it): the quantity table's cases, Kubernetes' own
    answers (tests/data/quantity_table.json), and the policy's range in each form."""
    table = json.loads((CHART.parents[1] / "tests" / "data" / "quantity_table.json")
                       .read_text())
    inside = ["1Mi", "1048576", "1048575", "1023Ki", "1024Ki", "0.5Mi", "3Ei", "4Ei",
              "4611686018427387903", "4611686018427387904", "64Mi", "1.5Gi", "2e9", "+2Gi"]
    return [(text, valid) for text, valid, _value in table] + [(t, True) for t in inside]


def _exponent_beyond_int64(text: str) -> bool:
    """``1e9223372036854775808``: the grammar's, but Kubernetes refuses the exponent's
    value (beyond int64), which a pattern cannot bound; the policy check refuses it too."""
    match = re.fullmatch(r".*[eE][+-]?([0-9]+)", text)
    return match is not None and int(match.group(1)) > 2**63 - 1


@pytest.mark.parametrize("field", ["minRequest", "defaultLimit"])
def test_quantity_strings_agree_with_the_grammar(field: str) -> None:
    """Every string the policy check accepts, the chart accepts; every string the chart
    accepts is a quantity (its value's range is the policy check's alone)."""
    wrong = []
    for text, parses in _quantities():
        profile = {field: text, **({"minRequest": "1Mi"} if field == "defaultLimit" else {})}
        chart, policy = chart_accepts(profile), policy_accepts(profile)
        if policy and not chart:
            wrong.append(f"{text!r}: the policy check accepts it, the chart refuses it")
        if chart and not parses and not _exponent_beyond_int64(text):
            wrong.append(f"{text!r}: the chart accepts it, Kubernetes parses no quantity")
    assert not wrong, "\n".join(wrong)


# No whole float (2097152.0): Helm reads every number of a values file as a float and
# writes a whole one into the ConfigMap as an integer, which the policy check accepts.
NUMBERS = [MIN_MEMORY - 1, MIN_MEMORY, MIN_MEMORY + 1, 64 * 2**20, MAX_MEMORY - 1, MAX_MEMORY,
           MAX_MEMORY + 1, 0, -1, MIN_MEMORY + 0.5, math.pi]


# defaultLimit 1Mi is left out: it is above no minRequest, which the policy check alone says.
NUMBER_CASES = [("minRequest", n) for n in NUMBERS] + \
    [("defaultLimit", n) for n in NUMBERS if n != MIN_MEMORY]


@pytest.mark.parametrize("field, value", NUMBER_CASES)
def test_quantity_numbers_agree(field: str, value: int | float) -> None:
    profile: dict[str, Any] = {field: value}
    if field == "defaultLimit":
        profile["minRequest"] = "1Mi"
    assert chart_accepts(profile) == policy_accepts(profile)
