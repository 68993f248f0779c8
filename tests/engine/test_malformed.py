"""docs/rules.md: malformed pods are left unchanged with a warning (engine/pod.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.engine_tables import DEFAULT
from tests.support.pods import guaranteed
from webhook.engine import mutate_pod


@pytest.mark.parametrize(
    "p",
    [
        None, [], "pod", {"spec": "x"}, {"spec": {"containers": {}}},
        {"spec": {"containers": [{"resources": {}}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": {"memory": "lots"}}}]}},
        {"spec": {"containers": [{"name": "a", "resources": {"limits": "2Gi"}}]}},
        {"metadata": {"annotations": []}, "spec": {"containers": [guaranteed()]}},
        {"spec": {"containers": [guaranteed()], "affinity": []}},
    ],
)
def test_malformed_pods_are_left_unchanged(p: Any) -> None:
    mutation = mutate_pod(p, DEFAULT)
    assert mutation.patch == [] and mutation.skipped == "malformed"
    assert mutation.warnings and mutation.warnings[0].startswith("swapwise: pod left unchanged")
