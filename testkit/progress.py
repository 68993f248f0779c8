"""Let a slow build's progress reach the terminal from inside a pytest fixture."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def uncaptured(config: pytest.Config) -> Iterator[None]:
    """Suspend output capture: a cold build takes minutes, and silence looks like a hang."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        yield
