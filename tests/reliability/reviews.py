"""Hypothesis strategies for AdmissionReviews: real pods bent out of shape, and garbage.

Shared by the in-process fuzzing (volume) and the HTTPS fuzzing (the real stack).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tests.reliability.support import LONG, example_pods, examples, review_bytes


def fuzz(n: int) -> settings:
    """CI: ``n`` examples, the same ones every run (a red CI is then a regression, not
    luck). Long mode: many more, fresh each run, to find what the fixed sample misses."""
    return settings(max_examples=examples(n), deadline=None, database=None,
                    derandomize=not LONG, suppress_health_check=list(HealthCheck))
EXAMPLE_PODS = list(example_pods())

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
    st.sampled_from(["2Gi", "100m", "", "Always", "memory", "-1", "1e400", "0"]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into a JSON tree, the root's () first."""
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from paths(value, (*prefix, index))


@st.composite
def mutated_example_pods(draw: st.DrawFn) -> dict[str, Any]:
    """A real pod from examples/ with a few values deleted, retyped or replaced."""
    pod = copy.deepcopy(draw(st.sampled_from(EXAMPLE_PODS)))
    for _ in range(draw(st.integers(1, 4))):
        candidates = [p for p in paths(pod) if p]
        if not candidates:
            break
        path = draw(st.sampled_from(candidates))
        parent: Any = pod
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["delete", "replace", "replace", "duplicate"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "duplicate" and isinstance(parent, list):
            parent.append(copy.deepcopy(parent[path[-1]]))
        else:
            parent[path[-1]] = draw(json_values)
    return pod


@st.composite
def broken_reviews(draw: st.DrawFn) -> bytes:
    """A review with garbage at one level: the body, the request, or its fields."""
    body: dict[str, Any] = json.loads(review_bytes(draw(st.sampled_from(EXAMPLE_PODS))))
    where = draw(st.sampled_from(
        ["body", "request", "uid", "kind", "operation", "object", "namespace", "apiVersion",
         "subResource", "metadata", "spec", "containers", "resources"]))
    value = draw(json_values)
    request, pod = body["request"], body["request"]["object"]
    if where == "body":
        return json.dumps(value).encode()
    if where == "request":
        body["request"] = value
    elif where in ("uid", "kind", "operation", "object", "namespace", "subResource"):
        request[where] = value
    elif where == "apiVersion":
        body["apiVersion"] = value
    elif where in ("metadata", "spec"):
        pod[where] = value
    elif where == "containers":
        pod["spec"]["containers"] = value
    else:
        pod["spec"]["containers"][0]["resources"] = value
    return json.dumps(body).encode()
