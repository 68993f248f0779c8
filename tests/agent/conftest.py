"""Fixtures of the node agent's tests: one CA and serving certificate per session."""

from __future__ import annotations

import pytest

from tests.agent.support import Tls


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return Tls.make(tmp_path_factory.mktemp("tls"))
