"""promtool and prometheus for the monitoring tests: built from Go modules once, cached.

tests/e2e/build-prometheus.sh does the build (stamp-checked; a second call builds nothing).
Like the chart tests' helm, a missing binary is built, never skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "tests" / "e2e" / "build-prometheus.sh"
RULES = REPO / "charts" / "swapwise" / "files" / "prometheus-rules.yaml"
DASHBOARD = REPO / "charts" / "swapwise" / "files" / "dashboard.json"
# What Grafana substitutes in the dashboard's queries, for Prometheus without Grafana.
GRAFANA_VARIABLES = {"$__rate_interval": "5m"}


def prometheus_version() -> str:
    gomod = (REPO / "tests" / "e2e" / "gomod" / "prometheus" / "go.mod").read_text()
    match = re.search(r"^require github.com/prometheus/prometheus v0\.(\d+)(\d\d)\.(\d+)$",
                      gomod, re.M)
    assert match, "tests/e2e/gomod/prometheus/go.mod names no prometheus version"
    return f"{match[1]}.{int(match[2])}.{match[3]}"


def bin_dir() -> Path:
    default = Path.home() / ".cache" / "swapwise" / "prometheus" / prometheus_version() / "bin"
    return Path(os.environ.get("SWAPWISE_PROM_BIN", default))


def ensure(name: str) -> Path:
    """The binary, built first when missing or stale (the script checks its stamp)."""
    path = bin_dir() / name
    proc = subprocess.run([str(BUILD), name], capture_output=True, text=True, timeout=3600,
                          check=False)
    if proc.returncode != 0 or not path.is_file():
        raise RuntimeError(f"{BUILD} {name} failed:\n{proc.stdout[-2000:]}{proc.stderr[-4000:]}")
    return path


def panels() -> list[dict[str, Any]]:
    """Every panel of the dashboard (rows' nested panels too)."""
    found: list[dict[str, Any]] = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        found.append(panel)
        found += panel.get("panels", [])
    return found


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL with Grafana's variables substituted) for every target."""
    found = []
    for panel in panels():
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            found.append((panel["title"], expr))
    return found
