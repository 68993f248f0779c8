"""What reshaped containers really did, from Prometheus: ``swapwise tune``'s evidence.

Pure (no I/O): :func:`queries` says what to ask Prometheus' ``/api/v1/query`` over a window,
:func:`containers` turns the answers (each query's ``data.result``, a vector) into one
:class:`ContainerUsage` per container of a reshaped pod, and :func:`missing_metrics` says
which source is not scraped when an answer is empty. :mod:`webhook.cli.tune` sends them.

Two sources, both what clusters already scrape (kube-prometheus-stack does by default):

- kube-state-metrics: which profile reshaped each pod (its ``swapwise.io/profile``
  annotation, exported once allow-listed) and each container's memory request and limit.
  The kubelet's metrics carry neither.
- the kubelet's cAdvisor endpoint (``/metrics/cadvisor``): each container's working set,
  swap use and memory pressure (PSI, ``container_pressure_memory_*``, Kubernetes 1.34+).
  cAdvisor reads these from the container's cgroup, so they hold on runtimes whose CRI stats
  report no swap (containerd 1.x), where the ``/metrics/resource`` figures are 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from webhook.engine.pod import PROFILE_ANNOTATION

# kube-state-metrics turns an allow-listed annotation into a label this way.
PROFILE_LABEL = "annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", PROFILE_ANNOTATION)
KEYS = ("namespace", "pod", "container")
# A container's own cgroup: cAdvisor also reports the pod's cgroup and the sandbox's
# (container="" here; "POD" with dockershim-era runtimes).
CONTAINER = 'container!="", container!="POD"'
WORKING_SET = f"container_memory_working_set_bytes{{{CONTAINER}}}"
SWAP = f"container_memory_swap{{{CONTAINER}}}"
STALL = f"container_pressure_memory_waiting_seconds_total{{{CONTAINER}}}"
REQUEST = 'kube_pod_container_resource_requests{resource="memory"}'
LIMIT = 'kube_pod_container_resource_limits{resource="memory"}'
PROFILE = f'kube_pod_annotations{{{PROFILE_LABEL}!=""}}'
# The stretch each PSI share is a rate over: PSI's own longest average, and at least four
# scrapes at the usual 15-60 s intervals.
DEFAULT_RATE_INTERVAL = "5m"

_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


class UsageError(ValueError):
    """Input that cannot make a query (a window Prometheus would not read)."""


def duration(text: str, flag: str) -> str:
    """``text`` when Prometheus reads it as a duration (``7d``, ``1h30m``), else an error."""
    if not _DURATION.match(text) or not any(c != "0" for c in re.sub(r"\D", "", text)):
        raise UsageError(f"{flag}: {text!r} is not a Prometheus duration (e.g. 7d, 12h, 30m)")
    return text


def _by(expr: str) -> str:
    return f"max by ({', '.join(KEYS)}) ({expr})"


def queries(window: str, step: str, rate: str = DEFAULT_RATE_INTERVAL) -> dict[str, str]:
    """The PromQL for each figure, over ``window`` ending at the query's time.

    Every figure is per (namespace, pod, container): a container's series may be several
    (a restart, two scrapes of one kubelet), so each is the highest of them. ``step`` is the
    resolution of the figures taken at each point in time: the working set against the
    request, and the stall share, a rate over ``rate``. Both are averaged over the steps
    where the container existed: a pod that ran for a day of a week's window is judged by
    its day (``rate`` over the whole window would divide by the week).
    """
    request = _by(REQUEST)
    stall = _by(f"rate({STALL}[{rate}])")
    return {
        "profile": f"max by (namespace, pod, {PROFILE_LABEL}) "
                   f"(last_over_time({PROFILE}[{window}]))",
        "request": _by(f"last_over_time({REQUEST}[{window}])"),
        "limit": _by(f"last_over_time({LIMIT}[{window}])"),
        "samples": _by(f"count_over_time({WORKING_SET}[{window}])"),
        "working_set_p95": _by(f"quantile_over_time(0.95, {WORKING_SET}[{window}])"),
        "working_set_max": _by(f"max_over_time({WORKING_SET}[{window}])"),
        "above_request": f"avg_over_time(({_by(WORKING_SET)} > bool on ({', '.join(KEYS)}) "
                         f"{request})[{window}:{step}])",
        "swap_max": _by(f"max_over_time({SWAP}[{window}])"),
        "stall": f"avg_over_time(({stall})[{window}:{step}])",
        "stall_peak": f"max_over_time(({stall})[{window}:{step}])",
    }


# What to do when a source answers nothing at all (``count(...)`` over the window is empty).
PROBES: dict[str, tuple[str, str]] = {
    "kube_pod_container_resource_requests": (
        f"count(last_over_time({REQUEST}[{{window}}]))",
        "no pod's memory request is in Prometheus: install kube-state-metrics and scrape it "
        "(kube-prometheus-stack does both)"),
    "kube_pod_annotations": (
        f"count(last_over_time({PROFILE}[{{window}}]))",
        f"no pod's {PROFILE_ANNOTATION} annotation is in Prometheus: run kube-state-metrics "
        f"with --metric-annotations-allowlist=pods=[{PROFILE_ANNOTATION}] "
        f"(kube-prometheus-stack: kube-state-metrics.metricAnnotationsAllowList: "
        f"[\"pods=[{PROFILE_ANNOTATION}]\"]), or no pod was reshaped in the window"),
    "container_memory_working_set_bytes": (
        f"count(last_over_time({WORKING_SET}[{{window}}]))",
        "no container's working set is in Prometheus: scrape every kubelet's /metrics/cadvisor "
        "(kube-prometheus-stack: kubelet.serviceMonitor.cAdvisor, on by default; plain "
        "Prometheus: the kubelet-cadvisor job of docs/monitoring.md)"),
    "container_pressure_memory_waiting_seconds_total": (
        f"count(last_over_time({STALL}[{{window}}]))",
        "no container's memory pressure (PSI) is in Prometheus: the kubelet exports it from "
        "Kubernetes 1.34 (feature gate KubeletPSI, on by default there) on kernels with PSI "
        "(CONFIG_PSI, not disabled by psi=0 on the kernel command line)"),
}


def probes(window: str) -> dict[str, str]:
    """The PromQL that tells, per metric, whether any series of it is in the window."""
    return {metric: expr.replace("{window}", window) for metric, (expr, _) in PROBES.items()}


def missing_metrics(counts: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """What to do, one line per metric whose probe (:func:`probes`) answered nothing."""
    return [f"{metric}: {PROBES[metric][1]}" for metric in PROBES
            if not any(_number(r) for r in counts.get(metric, []))]


@dataclass(frozen=True)
class ContainerUsage:
    """One container of a reshaped pod over the window. Bytes, and shares of time (0-1);
    None where Prometheus had no figure for it."""

    namespace: str
    pod: str
    container: str
    profile: str
    request: float
    limit: float | None
    samples: int  # working-set samples in the window
    working_set_p95: float
    working_set_max: float
    above_request: float | None  # share of the window's steps with the working set > request
    swap_max: float | None
    stall: float | None  # share of the window some task of it waited for memory (PSI some)
    stall_peak: float | None  # its highest rate over one rate interval

    @property
    def key(self) -> tuple[str, str, str]:
        return self.namespace, self.pod, self.container


def _number(result: Mapping[str, Any]) -> float | None:
    """An instant vector element's value; None when absent, malformed or not finite."""
    try:
        value = float(result["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _per_key(answer: list[dict[str, Any]] | None) -> dict[tuple[str, str, str], float]:
    found: dict[tuple[str, str, str], float] = {}
    for result in answer or []:
        labels = result.get("metric") if isinstance(result, Mapping) else None
        value = _number(result) if isinstance(result, Mapping) else None
        if not isinstance(labels, Mapping) or value is None:
            continue
        key = (str(labels.get("namespace", "")), str(labels.get("pod", "")),
               str(labels.get("container", "")))
        if all(key):
            found[key] = max(value, found.get(key, value))
    return found


def _profiles(answer: list[dict[str, Any]] | None) -> dict[tuple[str, str], str]:
    found = {}
    for result in answer or []:
        labels = result.get("metric") if isinstance(result, Mapping) else None
        if not isinstance(labels, Mapping):
            continue
        namespace, pod = str(labels.get("namespace", "")), str(labels.get("pod", ""))
        profile = str(labels.get(PROFILE_LABEL, ""))
        if namespace and pod and profile:
            found[(namespace, pod)] = profile
    return found


def containers(answers: Mapping[str, list[dict[str, Any]] | None]) -> list[ContainerUsage]:
    """Every container of a pod with a profile annotation, a memory request and working-set
    samples in the window; partial answers leave the figures they lack as None."""
    profiles = _profiles(answers.get("profile"))
    figures = {name: _per_key(answers.get(name)) for name in
               ("request", "limit", "samples", "working_set_p95", "working_set_max",
                "above_request", "swap_max", "stall", "stall_peak")}
    found = []
    for key, samples in sorted(figures["samples"].items()):
        profile = profiles.get(key[:2])
        request = figures["request"].get(key)
        p95 = figures["working_set_p95"].get(key)
        if profile is None or not request or request <= 0 or p95 is None or samples < 1:
            continue
        found.append(ContainerUsage(
            namespace=key[0], pod=key[1], container=key[2], profile=profile,
            request=request, limit=figures["limit"].get(key), samples=int(samples),
            working_set_p95=p95,
            working_set_max=figures["working_set_max"].get(key, p95),
            above_request=figures["above_request"].get(key),
            swap_max=figures["swap_max"].get(key),
            stall=_share(figures["stall"].get(key)),
            stall_peak=_share(figures["stall_peak"].get(key)),
        ))
    return found


def _share(value: float | None) -> float | None:
    """A PSI rate as a share of time: a counter's rate can overshoot 1 by scrape jitter."""
    return None if value is None else min(max(value, 0.0), 1.0)
