"""pytest fixtures for the end-to-end tests: one real control plane per session.

Set SWAPWISE_SKIP_E2E=1 to skip them; otherwise missing binaries are built first (slow once,
cached after: see build-control-plane.sh). SWAPWISE_E2E_KEEP=1 keeps the work dir and logs.
"""

from __future__ import annotations

import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # so `tests.e2e.cluster` imports under plain `pytest` too
    sys.path.insert(0, str(REPO_ROOT))

from testkit.progress import uncaptured  # noqa: E402
from tests.e2e.admission_api import policy_control_plane  # noqa: E402
from tests.e2e.cluster import (  # noqa: E402
    DEFAULT_LINE,
    ControlPlane,
    ensure_binaries,
    skip_unless_e2e,
    swap_node_labels,
)

SWAP_NODES = ("swap-1", "swap-2")
PLAIN_NODES = ("plain-1",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``line(L)`` run only in a session of line L (SWAPWISE_K8S_VERSION): they
    start that line's API server themselves, so a run over both lines takes them once."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        pinned = item.get_closest_marker("line")
        (dropped if pinned is not None and pinned.args[0] != DEFAULT_LINE else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + scheduler + controller-manager, torn down after the session."""
    skip_unless_e2e()
    with uncaptured(pytestconfig):
        binaries = ensure_binaries()
    with ControlPlane(binaries) as cp:
        yield cp


@pytest.fixture(scope="module")
def policy_cluster(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """A control plane whose API server is the admission-policy line's (admission_api.LINE),
    one per module: the admission-policy tests install policies cluster-wide."""
    with uncaptured(pytestconfig), policy_control_plane() as cp:
        yield cp


@pytest.fixture(scope="session")
def standard_nodes(control_plane: ControlPlane) -> dict[str, list[str]]:
    """Two swap nodes (16Gi RAM + 32Gi swap, labelled in full: swap_node_labels) and one node
    without swap."""
    for name in SWAP_NODES:
        control_plane.create_node(
            name,
            memory="16Gi",
            cpu="8",
            labels=swap_node_labels(32 << 30, 16 << 30),
            swap_capacity=32 * 1024**3,
        )
    for name in PLAIN_NODES:
        control_plane.create_node(name, memory="16Gi", cpu="8")
    return {"swap": list(SWAP_NODES), "plain": list(PLAIN_NODES)}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """On a failing e2e test, attach the tail of every component log to the report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        cp = item.funcargs.get("control_plane")  # type: ignore[attr-defined]
        if isinstance(cp, ControlPlane):
            report.sections.append(("control plane logs", cp.logs()))
