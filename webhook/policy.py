"""The policy file (README "Policy reference"): schema, field-path validation, compilation.

A typo must never silently do nothing, so unknown fields, duplicate keys and values
out of range are all errors. A valid file is compiled once into frozen
:class:`~webhook.profile.Profile` objects, one per (profile, namespace override), so
the admission hot path only does a dictionary lookup.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    model_validator,
)

from webhook.files import read_regular
from webhook.profile import SWAP_LABEL, LabelSelector, Placement, Profile
from webhook.quantity import QuantityError, parse_bytes, parse_quantity

API_VERSION = "swapwise.io/v1alpha1"
KIND = "SwapPolicy"
DEFAULT_SWAP_RATIO = 2
DEFAULT_MIN_REQUEST = "16Mi"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A ConfigMap holds at most 1 MiB; a policy is a few hundred bytes. Anchors and aliases
# may repeat a value, but the document they expand to stays small and shallow.
MAX_FILE_BYTES = 1024 * 1024
MAX_VALUES = 100_000
MAX_DEPTH = 64


class PolicyError(ValueError):
    """An invalid policy; ``errors`` holds one ``field.path: message`` line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: invalid policy:\n" + "\n".join(f"  {e}" for e in errors))


def _positive_quantity(value: str | int) -> str | int:
    try:
        parsed = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    if parsed <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    return value


def _not_a_yaml_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not 'required' or 'off': YAML reads an "
                         "unquoted off (or no, false) as a boolean; write 'off' in quotes")
    return value


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError(f"{value!r} is not a DNS label (lowercase letters, digits and '-')")
    return value


Number = StrictInt | StrictFloat
MemoryQuantity = Annotated[str | StrictInt, AfterValidator(_positive_quantity)]
Name = Annotated[str, AfterValidator(_dns_label)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TolerationSpec(_Strict):
    key: str | None = None
    operator: Literal["Equal", "Exists"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute", ""] | None = None
    tolerationSeconds: StrictInt | None = None

    @model_validator(mode="after")
    def _exists_has_no_value(self) -> TolerationSpec:
        if self.operator == "Exists" and self.value:
            raise ValueError("a toleration with operator Exists must not have a value")
        if not self.key and self.operator != "Exists":
            raise ValueError("a toleration without a key must use operator Exists")
        return self


class SelectorRequirement(_Strict):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_match_operator(self) -> SelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class PodSelectorSpec(_Strict):
    matchLabels: dict[str, str] = Field(default_factory=dict)
    matchExpressions: list[SelectorRequirement] = Field(default_factory=list)


class PlacementSpec(_Strict):
    mode: Literal["required", "preferred", "none"] = "required"
    nodeSelector: dict[str, str] = Field(default_factory=lambda: {SWAP_LABEL: "true"})
    weight: Annotated[StrictInt, Field(ge=1, le=100)] = 100
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    # With mode: required, also require nodes whose swap backs the changed containers
    # (label swapwise.io/swap-permille, written by `swapwise label-nodes`); no effect otherwise.
    swapBacking: Annotated[Literal["required", "off"],
                           BeforeValidator(_not_a_yaml_boolean)] = "required"


class ProfileSpec(_Strict):
    swapRatio: Annotated[Number, Field(gt=0)] | None = None
    requestRatio: Annotated[Number, Field(gt=0, lt=1)] | None = None
    minRequest: MemoryQuantity = DEFAULT_MIN_REQUEST
    maxLimitRequestRatio: Annotated[Number, Field(gt=1)] | None = None
    defaultLimit: MemoryQuantity | None = None
    guaranteedPods: Literal["convert", "skip"] = "convert"
    vpaPods: Literal["skip", "raiseLimit"] = "raiseLimit"
    resizePolicy: Literal["RestartContainer", "keep"] = "RestartContainer"
    podSelector: PodSelectorSpec | None = None
    placement: PlacementSpec = Field(default_factory=PlacementSpec)

    @model_validator(mode="after")
    def _consistent(self) -> ProfileSpec:
        if self.swapRatio is not None and self.requestRatio is not None:
            raise ValueError("give swapRatio or requestRatio, not both (they are the same knob)")
        limit = self.defaultLimit
        if limit is not None and parse_bytes(limit) <= parse_bytes(self.minRequest):
            raise ValueError("defaultLimit must be greater than minRequest")
        return self

    def request_ratio(self) -> Fraction:
        if self.requestRatio is not None:
            return _exact(self.requestRatio)
        swap = _exact(self.swapRatio if self.swapRatio is not None else DEFAULT_SWAP_RATIO)
        return 1 / (1 + swap)


class PolicySpec(_Strict):
    apiVersion: Literal["swapwise.io/v1alpha1"]
    kind: Literal["SwapPolicy"]
    profiles: Annotated[dict[Name, ProfileSpec], Field(min_length=1)]
    # Overrides are checked field by field once merged into each profile.
    namespaces: dict[Name, dict[str, Any]] = Field(default_factory=dict)


def _exact(number: float | int) -> Fraction:
    return Fraction(Decimal(repr(number))) if isinstance(number, float) else Fraction(number)


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A namespace override: fields replace the profile's; ``placement`` merges by field.

    ``swapRatio`` and ``requestRatio`` are one knob, so giving either replaces both.
    """
    merged = dict(base)
    if "swapRatio" in override or "requestRatio" in override:
        merged.pop("swapRatio", None)
        merged.pop("requestRatio", None)
    for key, value in override.items():
        if key == "placement" and isinstance(value, dict):
            placement = merged.get("placement")
            merged[key] = {**(placement if isinstance(placement, dict) else {}), **value}
        else:
            merged[key] = value
    return merged


def compile_profile(name: str, spec: ProfileSpec) -> Profile:
    selector = None
    if spec.podSelector is not None:
        selector = LabelSelector(
            match_labels=tuple(sorted(spec.podSelector.matchLabels.items())),
            match_expressions=tuple(
                (r.key, r.operator, tuple(r.values)) for r in spec.podSelector.matchExpressions
            ),
        )
    placement = spec.placement
    return Profile(
        name=name,
        request_ratio=spec.request_ratio(),
        min_request=parse_bytes(spec.minRequest),
        max_limit_request_ratio=(
            _exact(spec.maxLimitRequestRatio) if spec.maxLimitRequestRatio is not None else None
        ),
        default_limit=parse_bytes(spec.defaultLimit) if spec.defaultLimit is not None else None,
        guaranteed_pods=spec.guaranteedPods,
        vpa_pods=spec.vpaPods,
        resize_policy=spec.resizePolicy,
        pod_selector=selector,
        placement=Placement(
            mode=placement.mode,
            node_selector=tuple(placement.nodeSelector.items()),
            weight=placement.weight,
            tolerations=tuple(t.model_dump(exclude_none=True) for t in placement.tolerations),
            swap_backing=placement.swapBacking,
        ),
    )


@dataclass(frozen=True)
class Policy:
    """A validated, compiled policy: what the server holds and swaps atomically on reload."""

    profiles: dict[str, Profile]
    overrides: dict[tuple[str, str], Profile] = field(default_factory=dict)
    source: str = "built-in"
    digest: str = ""

    def resolve(self, profile: str, namespace: str | None = None) -> Profile | None:
        """The profile for a pod in ``namespace``, with that namespace's overrides."""
        if namespace is not None:
            found = self.overrides.get((profile, namespace))
            if found is not None:
                return found
        return self.profiles.get(profile)


def _format_errors(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[str]:
    errors = []
    for error in exc.errors():
        loc = [str(part) for part in (*prefix, *error["loc"])]
        # pydantic reports union members and validator names as path parts; drop them.
        loc = [part for part in loc if not part.startswith(("function-", "constrained-"))]
        loc = [p for p in loc if p not in ("int", "float", "str", "str-int", "function-after")]
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field (check the spelling: unknown fields are never ignored)"
        errors.append(f"{'.'.join(loc) or '(root)'}: {message}")
    return list(dict.fromkeys(errors))


def _check_size(document: Any) -> str | None:
    """Why ``document`` is too big or too deep to be a policy, if it is (no recursion)."""
    stack: list[tuple[Any, int]] = [(document, 0)]
    values = 0
    while stack:
        node, depth = stack.pop()
        values += 1
        if values > MAX_VALUES:
            return f"more than {MAX_VALUES} values (aliases included)"
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for pair in node.items() for child in pair)
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return None


def build_policy(document: Any, source: str = "<policy>") -> Policy:
    """Validate a parsed policy document and compile it; raises :class:`PolicyError`
    (and nothing else, whatever the document holds)."""
    if not isinstance(document, dict):
        raise PolicyError(source, ["(root): the policy must be a YAML mapping"])
    problem = _check_size(document)
    if problem is not None:
        raise PolicyError(source, [f"(root): {problem}"])
    try:
        return _build(document, source)
    except PolicyError:
        raise
    except Exception as exc:  # a shape no check above foresaw: still a refusal, not a crash
        raise PolicyError(source, [f"(root): cannot be read as a policy: "
                                   f"{type(exc).__name__}: {exc}"]) from None


def _build(document: dict[Any, Any], source: str) -> Policy:
    try:
        spec = PolicySpec.model_validate(document)
    except ValidationError as exc:
        raise PolicyError(source, _format_errors(exc)) from None
    profiles = {name: compile_profile(name, profile) for name, profile in spec.profiles.items()}
    overrides: dict[tuple[str, str], Profile] = {}
    errors: list[str] = []
    raw_profiles = document.get("profiles") or {}
    for namespace, override in spec.namespaces.items():
        for name in spec.profiles:
            merged = _merge(raw_profiles.get(name) or {}, override)
            try:
                overrides[(name, namespace)] = compile_profile(
                    name, ProfileSpec.model_validate(merged)
                )
            except ValidationError as exc:
                errors.extend(_format_errors(exc, ("namespaces", namespace)))
    if errors:
        raise PolicyError(source, list(dict.fromkeys(errors)))
    digest = hashlib.sha256(repr(document).encode()).hexdigest()[:12]
    return Policy(profiles=profiles, overrides=overrides, source=source, digest=digest)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys: the later one would silently win."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise yaml.constructor.ConstructorError(
                None, None, "mapping keys must be plain values, not lists or mappings",
                key_node.start_mark,
            )
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate policy text; raises :class:`PolicyError` for any bad content."""
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise PolicyError(source, [f"(yaml): {exc}".replace("\n", " ")]) from None
    except RecursionError:
        raise PolicyError(source, ["(yaml): nested too deeply to be a policy"]) from None
    except Exception as exc:  # e.g. a date PyYAML cannot build (2024-02-30)
        raise PolicyError(source, [f"(yaml): {type(exc).__name__}: {exc}"]) from None
    return build_policy(document, source)


def parse_policy_bytes(data: bytes, source: str = "<policy>") -> Policy:
    """A policy file's content, as read from disk (UTF-8)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(source, [f"(file): {exc}"]) from None
    return parse_policy(text, source)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; raises :class:`PolicyError` with field paths."""
    try:
        data = read_regular(Path(path), MAX_FILE_BYTES)
    except OSError as exc:
        raise PolicyError(str(path), [f"(file): {exc}"]) from None
    return parse_policy_bytes(data, str(path))


def default_policy() -> Policy:
    """The built-in policy: one profile ``default`` with every default."""
    return build_policy(
        {"apiVersion": API_VERSION, "kind": KIND, "profiles": {"default": {}}}, "built-in"
    )
