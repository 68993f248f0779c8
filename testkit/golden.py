"""The golden outputs of the rendered admission policies: where they live, what identifies
the rendering they were recorded under, and how a pod is compared with what the API server
stored.

Recorded from a real kube-apiserver by tests/e2e/record_cel_golden.py
(``make admission-policy-golden``); checked by tests/render/test_admission_policy_golden.py.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from pathlib import Path
from typing import Any

from webhook.base.quantity import parse_quantity

GOLDEN = (Path(__file__).resolve().parents[1] / "tests" / "data"
          / "admission-policy-golden.json")


def rendered_digest(objects: list[dict[str, Any]]) -> str:
    """What identifies a rendering: any change of the rendered objects changes it."""
    return hashlib.sha256(json.dumps(objects, sort_keys=True).encode()).hexdigest()


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def _canonical_resources(resources: Any) -> None:
    if not isinstance(resources, dict):
        return
    for kind in ("requests", "limits"):
        values = resources.get(kind)
        if isinstance(values, dict):
            for name, value in values.items():
                with contextlib.suppress(TypeError, ValueError):
                    values[name] = str(parse_quantity(value))


def comparable(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod``'s metadata and spec with every resource quantity as its exact value: the API
    server stores quantities in canonical form (``89478485333m``), the engine writes its own
    (``85Mi``); the values are what must agree."""
    out = copy.deepcopy({"metadata": pod.get("metadata"), "spec": pod.get("spec")})
    spec = out["spec"] if isinstance(out["spec"], dict) else {}
    for field in ("containers", "initContainers"):
        items = spec.get(field)
        for container in items if isinstance(items, list) else []:
            if isinstance(container, dict):
                _canonical_resources(container.get("resources"))
    _canonical_resources(spec.get("resources"))
    return out
