"""Prometheus metrics (README "Operations"), on a registry of their own so tests stay isolated.

With ``serve --workers N`` a scrape reaches whichever worker accepts the connection, so
per-process numbers would jump around between scrapes. Workers therefore share their
samples through prometheus_client's multiprocess mode (one mmap file per worker in a
directory the parent creates, see ``webhook/server/workers.py``), and every worker's
``/metrics`` shows the sum over all of them: counters and histograms add up, gauges show
the most recent value written by a live worker.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client import values as prometheus_values
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# `_created` series double the output and no dashboard uses them.
disable_created_metrics()  # type: ignore[no-untyped-call]

# An admission's own time is far below a millisecond (BENCHMARKS.md): the buckets start
# at 100 µs so that the histogram resolves it.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)


class Metrics:
    def __init__(self, multiprocess_dir: Path | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        if multiprocess_dir is not None:
            # Values are chosen when a metric is created: mmap-backed ones from here on.
            os.environ[MULTIPROC_ENV] = str(multiprocess_dir)
            prometheus_values.ValueClass = prometheus_values.MultiProcessValue()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "swapwise_admission_requests",
            "Admission requests by profile and outcome.",
            ["profile", "outcome"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "swapwise_admission_duration_seconds",
            "Time to answer one admission request, body read to response built.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.containers_changed = Counter(
            "swapwise_containers_changed",
            "Containers whose memory request was reshaped.",
            ["profile"],
            registry=self.registry,
        )
        self.policy_reloads = Counter(
            "swapwise_policy_reloads",
            "Policy file reloads; result=failure keeps the last good policy.",
            ["result"],
            registry=self.registry,
        )
        self.certificate_reloads = Counter(
            "swapwise_certificate_reloads",
            "Serving certificate reloads.",
            ["result"],
            registry=self.registry,
        )
        self.watcher_restarts = Counter(
            "swapwise_watcher_restarts",
            "File watchers restarted after an unexpected failure (logged with a traceback).",
            ["watcher"],
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "swapwise_certificate_expiry_timestamp_seconds",
            "Expiry (Unix time) of the serving certificate in use.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )
        # Export reload series at zero from the start, so alerts on increase() work.
        for result in ("success", "failure"):
            self.policy_reloads.labels(result)
            self.certificate_reloads.labels(result)
        self.watcher_restarts.labels("files")
        self.policy_profiles = Gauge(
            "swapwise_policy_profiles",
            "Profiles in the policy in use.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )

    def exposition(self) -> CollectorRegistry:
        """The registry to serve on /metrics: this process's, or the sum of all workers'."""
        if self.multiprocess_dir is None:
            return self.registry
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return registry
