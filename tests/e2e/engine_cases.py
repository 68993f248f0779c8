"""The (pod, profile) cases of the engine's table tests (tests/engine), as data.

Why: the admission-policy equivalence test replays exactly those cases through a real API
server. The table tests are plain test functions, not data tables, so they are run once
in a child pytest with this module as a plugin (``-p tests.e2e.engine_cases``): while
SWAPWISE_RECORD_CASES names a file, every call of ``mutate_pod`` is recorded there
(pickled: profiles hold Fractions).
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import webhook.engine
import webhook.engine.mutate
from webhook.profile import Profile

ROOT = Path(__file__).resolve().parents[2]
RECORD_ENV = "SWAPWISE_RECORD_CASES"
# The engine's table tests: each case a pod and a profile written out. tests/engine holds more
# since it mirrors webhook/engine (the property tests draw thousands, the swap-rule and VPA
# tests reach through other modules): the equivalence test and its golden recording replay
# the tables alone, as they did when tests/engine held only them.
TABLES = tuple(f"tests/engine/test_{name}.py" for name in (
    "annotations", "backing", "malformed", "placement", "pressure", "resize", "resources",
    "skip"))
Case = tuple[str, dict[str, Any], Profile]  # (test id, pod, profile)

_recorded: list[Case] = []
_current = ["?"]


def _install() -> None:
    original = webhook.engine.mutate.mutate_pod

    def recording(pod: Any, profile: Profile, **kwargs: Any) -> Any:
        # Offline-only knobs (daemonset=...) have no API-server equivalent: not recorded.
        if not kwargs and isinstance(pod, dict):
            _recorded.append((_current[0], copy.deepcopy(pod), profile))
        return original(pod, profile, **kwargs)

    webhook.engine.mutate_pod = recording  # type: ignore[assignment]
    webhook.engine.mutate.mutate_pod = recording  # type: ignore[assignment]


if os.environ.get(RECORD_ENV):
    _install()


def pytest_runtest_setup(item: Any) -> None:
    _current[0] = item.nodeid


def pytest_sessionfinish(session: Any) -> None:
    path = os.environ.get(RECORD_ENV)
    if path:
        Path(path).write_bytes(pickle.dumps(_recorded))


def table_cases(workdir: Path) -> list[Case]:
    """Run the engine's table tests with the recorder; their distinct cases, in test order."""
    out = workdir / "engine-cases.pickle"
    env = {**os.environ, RECORD_ENV: str(out)}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.e2e.engine_cases",
         "-p", "no:cacheprovider", *TABLES],
        cwd=ROOT, env=env, check=True, capture_output=True, timeout=600,
    )
    cases: list[Case] = pickle.loads(out.read_bytes())
    seen: set[str] = set()
    distinct = []
    for case in cases:
        key = repr((case[1], case[2]))
        if key not in seen:
            seen.add(key)
            distinct.append(case)
    return distinct
