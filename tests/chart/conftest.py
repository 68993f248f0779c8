"""Fixtures for the Helm chart tests (helpers live in chartlib.py)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from chartlib import Chart, find_helm


@pytest.fixture(scope="session")
def helm_bin() -> Path:
    try:
        return find_helm()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def chart(helm_bin: Path) -> Iterable[Chart]:
    with tempfile.TemporaryDirectory(prefix="swapwise-chart-") as tmp:
        yield Chart(helm_bin, Path(tmp))
