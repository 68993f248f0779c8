"""Go's caches live under ~/.cache/swapwise, the one directory CI keeps (tests/go-env.sh)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GO_ENV = ROOT / "tests" / "go-env.sh"


def test_go_env_puts_both_caches_under_the_swapwise_cache(tmp_path: Path) -> None:
    out = subprocess.run(
        ["bash", "-c", f'source "{GO_ENV}" && go env GOMODCACHE GOCACHE'],
        env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=True,
    )
    cache = tmp_path / ".cache" / "swapwise" / "go"
    assert out.stdout.split() == [str(cache / "mod"), str(cache / "build")]


def test_every_script_that_runs_go_sources_go_env() -> None:
    scripts = [p for p in (ROOT / "tests").rglob("*.sh") if p != GO_ENV]
    runs_go = [p for p in scripts if re.search(r"\bgo (build|mod|install|run|get)\b",
                                                p.read_text())]
    assert runs_go, "no build script runs go any more?"
    for script in runs_go:
        assert re.search(r'^source "\$here/[./]*go-env\.sh"$', script.read_text(),
                         re.MULTILINE), script
