"""Session-wide test settings: temporary files stay inside the checkout.

Without this pytest keeps its last three runs under /tmp/pytest-of-<user>. Each session here
gets its own directory under build/pytest/ (so concurrent sessions never clear each other's),
removed when the session passes and kept, with its path printed, when it fails.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

BASETEMP_ROOT = Path(__file__).resolve().parent / "build" / "pytest"
_OWN_BASETEMP = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp is None:
        BASETEMP_ROOT.mkdir(parents=True, exist_ok=True)
        own = Path(tempfile.mkdtemp(prefix="run-", dir=BASETEMP_ROOT))
        config.option.basetemp = str(own)
        config.stash[_OWN_BASETEMP] = own


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is None:
        return
    if exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)
    else:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"temporary files of this run kept in {own}")
