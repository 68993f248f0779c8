"""promtool and prometheus for the monitoring tests: built from Go modules once, cached.

tests/e2e/build-prometheus.sh does the build (stamp-checked; a second call builds nothing).
Like the chart tests' helm, a missing binary is built, never skipped.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.cluster import Component, free_port, wait_for

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


class Prometheus:
    """A Prometheus on loopback with the chart's alerting rules and the given scrape jobs."""

    def __init__(self, workdir: Path, scrape_configs: list[dict[str, Any]],
                 scrape_interval: str = "1s") -> None:
        self.port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        config = {
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(json.dumps(config, indent=2))
        self.component = Component("prometheus", [
            str(ensure("prometheus")), f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ], workdir / "prometheus.log")

    def __enter__(self) -> Prometheus:
        self.component.start()
        wait_for(lambda: self._ready(), 60, what="prometheus /-/ready",
                 on_timeout=self.component.tail)
        return self

    def __exit__(self, *exc: object) -> None:
        self.component.stop()

    def _ready(self) -> bool:
        self.component.check_alive()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    @property
    def url(self) -> str:
        """The base URL, as a user passes it to ``swapwise tune --prometheus``."""
        return f"http://127.0.0.1:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def without_data(self, exprs: list[tuple[str, str]], timeout: float) -> list[tuple[str, str]]:
        """The (title, query) pairs still answering no series when ``timeout`` runs out."""
        deadline = time.monotonic() + timeout
        empty = exprs
        while empty:
            empty = [(t, e) for t, e in empty if not self.query(e)]
            if not empty or time.monotonic() > deadline:
                break
            time.sleep(1)
        return empty
