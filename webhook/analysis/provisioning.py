"""Can anything in the cluster give reshaped pods a node? ``swapwise audit``'s view of
autoscaling (docs/autoscaling.md).

Pure, like :mod:`webhook.analysis.audit`, which calls it: plain dicts in, plain results out.

Why it exists: a reshaped pod requires node labels (the profile's swap-node selector and
``swapwise.io/swap-permille Gt <need - 1>``) that swapwise's node agent writes only on a
running node. An autoscaler decides from a template: Karpenter knows only what a NodePool
declares. When no node carries the labels and no NodePool declares them, the pods stay
Pending and nothing adds the node that would take them: a deadlock no component names. This
module finds it, and says which label and value are missing.

Only the pod's *own* required expressions on swapwise's keys are judged (the profile's
``placement.nodeSelector`` keys and the per-mille), and only the positive ones (``In``,
``Exists``, ``Gt``, ``Lt``): a node marked under pressure exists and can back the pod once
cleared, and the user's other expressions (zones, instance types) are not swapwise's to
judge. So a finding is only made when swapwise's own labels are what no node and no NodePool
can provide.

Also here: the swap behaviour swapwise knows for a node (the node agent's facts, else the
declared label), for the check of nodes with swap whose kubelet runs ``NoSwap``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.engine.backing import PERMILLE_LABEL
from webhook.engine.nodes import NodeFacts, declared_behavior

NODEPOOL_API = "karpenter.sh/v1"
POSITIVE = ("In", "Exists", "Gt", "Lt")


@dataclass(frozen=True)
class Expression:
    """One node selector requirement of a pod, on one of swapwise's keys."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def text(self) -> str:
        """How a finding names it: ``key=value``, ``key > 1998 (>= 1999)``, ``key exists``."""
        if self.operator == "In":
            if len(self.values) == 1:
                return f"{self.key}={self.values[0]}"
            return f"{self.key} in ({', '.join(self.values)})"
        if self.operator == "Exists":
            return f"{self.key} (any value)"
        bound = _integer(self.values[0]) if len(self.values) == 1 else None
        if bound is None:
            return f"{self.key} {self.operator} {list(self.values)}"
        if self.operator == "Gt":
            return f"{self.key} > {bound} (>= {bound + 1})"
        return f"{self.key} < {bound}"

    def matches(self, value: str | None) -> bool:
        """Does a node whose label ``key`` has ``value`` (None: absent) satisfy it?"""
        if value is None:
            return False
        if self.operator == "In":
            return value in self.values
        if self.operator == "Exists":
            return True
        number, bound = _integer(value), _integer(self.values[0]) if self.values else None
        if number is None or bound is None:
            return False
        return number > bound if self.operator == "Gt" else number < bound


@dataclass(frozen=True)
class NodeTemplate:
    """What an autoscaler knows of the nodes it would add: a Karpenter NodePool's
    ``template.metadata.labels`` and ``template.spec.requirements``."""

    kind: str  # "NodePool"
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (key, operator, values)

    @property
    def ref(self) -> str:
        return f"{self.kind}/{self.name}"

    def offers(self, expression: Expression) -> bool:
        """Could a node of this template satisfy the expression? As Karpenter decides it
        (v1.15.0, ``Requirements.Compatible``): a custom label the template does not define
        is denied; a defined one must intersect."""
        if expression.key in self.labels:
            return expression.matches(self.labels[expression.key])
        found = [r for r in self.requirements if r[0] == expression.key]
        if not found:
            return False
        return all(_intersects(operator, values, expression) for _, operator, values in found)


def _intersects(operator: str, values: tuple[str, ...], expression: Expression) -> bool:
    """Does a template requirement leave some value that satisfies a pod's expression?"""
    if operator == "In":
        return any(expression.matches(v) for v in values)
    if operator == "DoesNotExist":
        return False
    if operator in ("Gt", "Lt") and expression.operator in ("Gt", "Lt"):
        low = _integer(values[0]) if values else None
        bound = _integer(expression.values[0]) if expression.values else None
        if low is None or bound is None:
            return False
        if operator == expression.operator:
            return True  # both unbounded the same way
        # template "> low" vs pod "< bound", or template "< low" vs pod "> bound"
        return low + 1 < bound if operator == "Gt" else bound + 1 < low
    if operator == "NotIn" and expression.operator == "In":
        return any(v not in values for v in expression.values)
    return True  # Exists, or a range the pod's In/Exists can fall into: not judged here


def _integer(text: str) -> int | None:
    """A label value as the scheduler reads it for Gt/Lt (a decimal int64); None if not."""
    try:
        return int(text, 10) if text.strip() == text and text else None
    except ValueError:
        return None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def nodepool_templates(nodepools: Iterable[dict[str, Any]]) -> list[NodeTemplate]:
    """The templates of Karpenter NodePools (``karpenter.sh/v1``), as the API serves them;
    fields of the wrong type are read as absent."""
    templates = []
    for pool in nodepools:
        name = _dict(pool.get("metadata")).get("name")
        template = _dict(_dict(pool.get("spec")).get("template"))
        labels = {k: v for k, v in _dict(_dict(template.get("metadata")).get("labels")).items()
                  if isinstance(k, str) and isinstance(v, str)}
        requirements = []
        raw = _dict(template.get("spec")).get("requirements")
        for item in raw if isinstance(raw, list) else []:
            item = _dict(item)
            key, operator = item.get("key"), item.get("operator")
            if isinstance(key, str) and isinstance(operator, str):
                requirements.append((key, operator, _strings(item.get("values"))))
        templates.append(NodeTemplate("NodePool", name if isinstance(name, str) else "?",
                                      labels, tuple(requirements)))
    return templates


def swapwise_keys(node_selector: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The label keys whose absence swapwise answers for: the profile's swap-node selector
    and the per-mille."""
    return frozenset(key for key, _ in node_selector) | {PERMILLE_LABEL}


def required_terms(pod: dict[str, Any], keys: frozenset[str]) -> list[list[Expression]]:
    """The pod's required node selector terms (ORed), each reduced to its positive
    expressions on ``keys``; ``spec.nodeSelector`` pairs on those keys are ANDed into each.
    An empty list: the pod requires none of them."""
    spec = _dict(pod.get("spec"))
    selector = [Expression(k, "In", (v,)) for k, v in _dict(spec.get("nodeSelector")).items()
                if k in keys and isinstance(v, str)]
    affinity = _dict(_dict(_dict(spec.get("affinity")).get("nodeAffinity"))
                     .get("requiredDuringSchedulingIgnoredDuringExecution"))
    raw_terms = affinity.get("nodeSelectorTerms")
    terms: list[list[Expression]] = []
    for term in raw_terms if isinstance(raw_terms, list) else []:
        expressions = list(selector)
        raw = _dict(term).get("matchExpressions")
        for item in raw if isinstance(raw, list) else []:
            item = _dict(item)
            key, operator = item.get("key"), item.get("operator")
            if key in keys and operator in POSITIVE:
                expressions.append(Expression(key, operator, _strings(item.get("values"))))
        terms.append(expressions)
    if not terms:
        return [selector] if selector else []
    # A term without any of swapwise's expressions lets the pod go anywhere, as far as
    # swapwise's labels go: nothing to judge.
    return terms if all(terms) else []


@dataclass(frozen=True)
class Placeability:
    """Why no node and no template can take a pod: the expressions (of its first term, the
    one swapwise writes) that none provides, or, when each is provided somewhere but never
    all together, all of them."""

    missing: tuple[Expression, ...]
    together: bool  # True: each is provided by some node or template, none has them all


def unplaceable(terms: list[list[Expression]], nodes: Iterable[Mapping[str, Any]],
                templates: Iterable[NodeTemplate]) -> Placeability | None:
    """None when some node's labels or some template satisfy every swapwise expression of
    some term (the pod can be placed or provisioned for, as far as swapwise's labels go)."""
    if not terms:
        return None
    node_labels = list(nodes)
    templates = list(templates)

    def node_has(labels: Mapping[str, Any], e: Expression) -> bool:
        value = labels.get(e.key)
        return e.matches(value if isinstance(value, str) else None)

    for term in terms:
        if any(all(node_has(labels, e) for e in term) for labels in node_labels):
            return None
        if any(all(t.offers(e) for e in term) for t in templates):
            return None
    first = terms[0]
    missing = tuple(e for e in first if not any(node_has(labels, e) for labels in node_labels)
                    and not any(t.offers(e) for t in templates))
    return Placeability(missing or tuple(first), together=not missing)


def swap_behavior(node: Mapping[str, Any]) -> str | None:
    """The node's kubelet swap behaviour as swapwise knows it: the node agent's facts (what
    it read from the kubelet, or the declaration it trusted), else the declared label."""
    facts = NodeFacts.of(node)
    if facts is not None and facts.swap_behavior:
        return facts.swap_behavior
    return declared_behavior(node)
