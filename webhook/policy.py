"""The policy file (README "Policy reference"): schema, field-path validation, compilation.

A typo must never silently do nothing, so unknown fields, duplicate keys and values
out of range are all errors. A valid file is compiled once into frozen
:class:`~webhook.profile.Profile` objects, one per (profile, namespace override), so
the admission hot path only does a dictionary lookup.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any, Literal

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

from webhook.base.documents import DocumentError, decode, load, size_problem
from webhook.base.files import FileTooLarge, read_regular
from webhook.base.labels import label_key_problem, label_value_problem
from webhook.base.quantity import INT64_SAFE, MI, QuantityError, parse_bytes, parse_quantity
from webhook.profile import (
    DEFAULT_GUARANTEED_PODS,
    DEFAULT_MIN_REQUEST,
    DEFAULT_NODE_SELECTOR,
    DEFAULT_PLACEMENT_MODE,
    DEFAULT_RESIZE_POLICY,
    DEFAULT_SWAP_BACKING,
    DEFAULT_SWAP_RATIO,
    DEFAULT_VPA_PODS,
    DEFAULT_WEIGHT,
    GuaranteedPods,
    LabelSelector,
    Placement,
    PlacementMode,
    Profile,
    ResizePolicy,
    SwapBacking,
    VpaPods,
)

API_VERSION = "swapwise.io/v1alpha1"
KIND = "SwapPolicy"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# A ConfigMap holds at most 1 MiB; a policy is a few hundred bytes. Anchors and aliases
# may repeat a value, but the document they expand to stays within webhook.base.documents'
# MAX_VALUES and MAX_DEPTH, as every file swapwise reads.
MAX_FILE_BYTES = 1024 * 1024
# Memory quantities of a profile: from 1Mi (the engine writes whole MiB, so a smaller
# minRequest never changes a result: 64 is 64 bytes, not 64Mi) to below 4Ei (2^62 bytes),
# where the engine's and the rendered CEL's 64-bit arithmetic stays exact.
MIN_MEMORY = MI
MAX_MEMORY = INT64_SAFE - 1


class PolicyError(ValueError):
    """An invalid policy; ``errors`` holds one ``field.path: message`` line per problem
    (``(file): ...`` when the file's content is not text, or it could not be read at all)."""

    def __init__(self, source: str, errors: list[str], unreadable: bool = False) -> None:
        self.source = source
        self.errors = errors
        self.unreadable = unreadable  # no content to judge: missing, not a file, forbidden
        super().__init__(self.text())

    def text(self) -> str:
        """``p.yaml: invalid policy:`` and an indented line per error; one line for a
        file that could not be read (``p.yaml: cannot read the policy file: ...``)."""
        if self.unreadable:
            reasons = "; ".join(e.removeprefix("(file): ") for e in self.errors)
            return f"{self.source}: cannot read the policy file: {reasons}"
        return f"{self.source}: invalid policy:\n" + "\n".join(f"  {e}" for e in self.errors)


def _memory_quantity(value: str | int) -> str | int:
    try:
        parsed = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    if parsed <= 0:
        raise ValueError(f"{value!r} must be greater than zero")
    if parsed < MIN_MEMORY:
        bare = isinstance(value, int) or value.isdigit()
        raise ValueError(
            f"{value!r} is {math.ceil(parsed)} bytes, below 1Mi: the engine writes whole MiB, "
            "so it would never change anything"
            + (f" (a quantity without a suffix is bytes: did you mean {value}Mi?)" if bare
               else ""))
    if parsed > MAX_MEMORY:
        raise ValueError(f"{value!r} is too large: memory quantities here must be below 4Ei "
                         "(beyond, 64-bit arithmetic is no longer exact)")
    return value


def _finite(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number, not {_shown(value)}")
    return value


def _not_a_yaml_boolean(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not 'required' or 'off': YAML reads an "
                         "unquoted off (or no, false) as a boolean; write 'off' in quotes")
    return value


def _label_key(key: str) -> str:
    problem = label_key_problem(key)
    if problem is not None:
        raise ValueError(f"{key!r} is not a label key the API server accepts: {problem}")
    return key


def _label_value(value: str) -> str:
    problem = label_value_problem(value)
    if problem is not None:
        raise ValueError(f"{value!r} is not a label value the API server accepts: {problem}")
    return value


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.fullmatch(value):
        raise ValueError(f"{value!r} is not a DNS label (lowercase letters, digits and '-')")
    return value


LabelKey = Annotated[str, AfterValidator(_label_key)]
# A toleration without a key (operator Exists) tolerates every taint.
TolerationKey = Annotated[str, AfterValidator(lambda key: key and _label_key(key))]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Number = Annotated[StrictInt | StrictFloat, AfterValidator(_finite)]
MemoryQuantity = Annotated[str | StrictInt, AfterValidator(_memory_quantity)]
Name = Annotated[str, AfterValidator(_dns_label)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TolerationSpec(_Strict):
    key: TolerationKey | None = None
    operator: Literal["Equal", "Exists"] | None = None
    value: LabelValue | None = None
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
    key: LabelKey
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[LabelValue] = Field(default_factory=list)

    @model_validator(mode="after")
    def _values_match_operator(self) -> SelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class PodSelectorSpec(_Strict):
    matchLabels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    matchExpressions: list[SelectorRequirement] = Field(default_factory=list)


class PlacementSpec(_Strict):
    mode: PlacementMode = DEFAULT_PLACEMENT_MODE
    nodeSelector: dict[LabelKey, LabelValue] = Field(
        default_factory=lambda: dict(DEFAULT_NODE_SELECTOR))
    weight: Annotated[StrictInt, Field(ge=1, le=100)] = DEFAULT_WEIGHT
    tolerations: list[TolerationSpec] = Field(default_factory=list)
    # With mode: required, also require nodes whose swap backs the changed containers
    # (label swapwise.io/swap-permille, written by `swapwise node-agent`); no effect otherwise.
    swapBacking: Annotated[SwapBacking, BeforeValidator(_not_a_yaml_boolean)] = (
        DEFAULT_SWAP_BACKING)


class ProfileSpec(_Strict):
    swapRatio: Annotated[Number, Field(gt=0)] | None = None
    requestRatio: Annotated[Number, Field(gt=0, lt=1)] | None = None
    minRequest: MemoryQuantity = DEFAULT_MIN_REQUEST
    maxLimitRequestRatio: Annotated[Number, Field(gt=1)] | None = None
    defaultLimit: MemoryQuantity | None = None
    guaranteedPods: GuaranteedPods = DEFAULT_GUARANTEED_PODS
    vpaPods: VpaPods = DEFAULT_VPA_PODS
    resizePolicy: ResizePolicy = DEFAULT_RESIZE_POLICY
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


# Where an unknown field may be: (model, field) -> (the model of its value, how many
# path parts (a map key, a list index) come between), for a "did you mean" among its fields.
_NESTED: dict[tuple[type[BaseModel], str], tuple[type[BaseModel], int]] = {
    (PolicySpec, "profiles"): (ProfileSpec, 1),
    (PolicySpec, "namespaces"): (ProfileSpec, 1),
    (ProfileSpec, "placement"): (PlacementSpec, 0),
    (ProfileSpec, "podSelector"): (PodSelectorSpec, 0),
    (PlacementSpec, "tolerations"): (TolerationSpec, 1),
    (PodSelectorSpec, "matchExpressions"): (SelectorRequirement, 1),
}


def _suggestion(loc: list[str]) -> str:
    """The field the unknown one at ``loc`` most likely meant (``swapRatio`` for
    ``swapRaito``); empty when none is close."""
    model: type[BaseModel] = PolicySpec
    index = 0
    while index < len(loc) - 1:
        nested = _NESTED.get((model, loc[index]))
        if nested is None:
            return ""
        model, skipped = nested
        index += 1 + skipped
    if index != len(loc) - 1:
        return ""
    close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
    return close[0] if close else ""


def _text_for_number(value: str) -> str:
    """Why a number written as text is refused, and how to write it."""
    try:
        number = float(value)
    except ValueError:
        return f"{value!r} is not a number"
    if re.fullmatch(r"\s*[-+]?[0-9]*\.?[0-9]*[eE][0-9]+\s*", value) and math.isfinite(number):
        mantissa, _, exponent = value.strip().lower().partition("e")
        mantissa = mantissa if "." in mantissa else f"{mantissa}.0"
        return (f"{value!r} is text, not a number: YAML reads an exponent only with a dot "
                f"and a sign; write {mantissa}e+{exponent}")
    return f"{value!r} is text, not a number: write it without quotes"


def _message(error: Any, union: set[str]) -> str:
    """One line for one pydantic error; ``union`` holds the error types pydantic reported
    for the same field (one per member of a union: int | float, str | int)."""
    kind, value = error["type"], error.get("input")
    if kind == "extra_forbidden":
        return "unknown field (check the spelling: unknown fields are never ignored)"
    if kind in ("int_type", "float_type", "string_type") and union & {"string_type"} \
            and union & {"int_type"}:  # str | int: a quantity
        return f"must be a quantity (e.g. 64Mi, 2Gi or a number of bytes), not {_shown(value)}"
    if kind in ("int_type", "float_type"):
        if isinstance(value, str):
            return _text_for_number(value)
        whole = kind == "int_type" and "float_type" not in union
        return f"must be {'a whole number' if whole else 'a number'}, not {_shown(value)}"
    if kind == "model_type":
        hint = " (write {} for every default)" if value is None else ""
        return f"must be a mapping of fields, not {_shown(value)}{hint}"
    message: str = error["msg"]
    return message.removeprefix("Value error, ")


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return _YAML_FLOATS.get(repr(value), repr(value)) if isinstance(value, float) else \
            str(value).lower()
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "a list"
    return "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}"


_YAML_FLOATS = {"inf": ".inf", "-inf": "-.inf", "nan": ".nan"}


def _format_errors(exc: ValidationError, prefix: tuple[str | int, ...] = ()) -> list[str]:
    found: list[tuple[str, Any]] = []
    for error in exc.errors():
        loc = [str(part) for part in (*prefix, *error["loc"])]
        # pydantic reports union members and validator names as path parts; drop them.
        loc = [part for part in loc if not part.startswith(("function-", "constrained-"))]
        loc = [p for p in loc if p not in ("int", "float", "str", "str-int", "function-after")]
        loc = [part or '""' for part in loc]  # an empty key
        found.append((".".join(loc), error))
    kinds: dict[str, set[str]] = {}
    for where, error in found:
        kinds.setdefault(where, set()).add(error["type"])
    errors = []
    for where, error in found:
        message = _message(error, kinds[where])
        if error["type"] == "extra_forbidden":
            suggestion = _suggestion(where.split("."))
            if suggestion:
                message = f"unknown field: did you mean {suggestion}? (unknown fields are " \
                          "never ignored)"
        errors.append(f"{where or '(root)'}: {message}")
    return list(dict.fromkeys(errors))


def build_policy(document: Any, source: str = "<policy>") -> Policy:
    """Validate a parsed policy document and compile it; raises :class:`PolicyError`
    (and nothing else, whatever the document holds)."""
    if not isinstance(document, dict):
        raise PolicyError(source, ["(root): the policy must be a YAML mapping"])
    problem = size_problem(document)
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


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """Parse and validate policy text; raises :class:`PolicyError` for any bad content."""
    try:
        [document] = load(text, source)
    except DocumentError as exc:
        where = "(root)" if exc.kind == "size" else f"({exc.kind})"
        raise PolicyError(source, [f"{where}: {exc.detail}"]) from None
    return build_policy(document, source)


def parse_policy_bytes(data: bytes, source: str = "<policy>") -> Policy:
    """A policy file's content, as read from disk (UTF-8)."""
    try:
        text = decode(data, source)
    except DocumentError as exc:
        raise PolicyError(source, [f"(file): {exc.detail}"]) from None
    return parse_policy(text, source)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy file; raises :class:`PolicyError` with field paths."""
    try:
        data = read_regular(Path(path), MAX_FILE_BYTES)
    except OSError as exc:
        # "No such file or directory", not "[Errno 2] No such file or directory: 'p.yaml'"
        reason = exc.strerror or str(exc).removeprefix(f"{path}: ")
        raise PolicyError(str(path), [f"(file): {reason}"],
                          unreadable=not isinstance(exc, FileTooLarge)) from None
    return parse_policy_bytes(data, str(path))


def default_policy() -> Policy:
    """The built-in policy: one profile ``default`` with every default."""
    return build_policy(
        {"apiVersion": API_VERSION, "kind": KIND, "profiles": {"default": {}}}, "built-in"
    )
