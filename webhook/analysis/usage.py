"""What reshaped containers really did, from Prometheus: ``swapwise tune``'s evidence.

Pure (no I/O): :func:`queries` says what to ask Prometheus' ``/api/v1/query`` over a window,
:func:`vector` keeps the well-formed part of an answer (each query's ``data.result``),
:func:`read` turns the answers into one :class:`ContainerUsage` per container of a reshaped
pod (and counts the ones it leaves out, with why), and :func:`missing_metrics` says which
source is not scraped when an answer is empty. :mod:`webhook.cli.tune_cmd` sends them.

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
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class Usage:
    """What :func:`read` made of the answers: the containers to judge, and the containers of
    reshaped pods it left out, counted per (profile, why), so a profile never shows "0 pods"
    without a word of what was dropped."""

    containers: list[ContainerUsage]
    dropped: dict[tuple[str, str], int] = field(default_factory=dict)


# No memory figure of a container is above 2^63 bytes (8 EiB: Kubernetes quantities and
# cgroup counters are 64-bit) or below one byte; such a figure is a broken exporter, and the
# arithmetic of a decision on it overflows or divides by zero.
MAX_BYTES = float(2**63)
Key = tuple[str, str, str]


def vector(result: Any) -> tuple[list[dict[str, Any]], int]:
    """The well-formed elements of an instant vector (``{"metric": {label: text},
    "value": [time, text]}``), and how many others there were. What passes is flat, so
    nothing after it can recurse on a structure an upstream nested thousands deep."""
    if not isinstance(result, list):
        return [], 0
    kept = []
    for element in result:
        if not isinstance(element, dict):
            continue
        labels, value = element.get("metric"), element.get("value")
        if isinstance(labels, dict) and all(isinstance(k, str) and isinstance(v, str)
                                            for k, v in labels.items()) \
                and isinstance(value, list) and len(value) == 2 \
                and isinstance(value[0], int | float) and not isinstance(value[0], bool) \
                and isinstance(value[1], str):
            kept.append({"metric": labels, "value": value})
    return kept, len(result) - len(kept)


def _raw_number(result: Mapping[str, Any]) -> float | None:
    """An instant vector element's value as a float (inf and NaN included); None when
    absent or unreadable."""
    try:
        return float(result["value"][1])
    except (KeyError, IndexError, TypeError, ValueError, OverflowError):
        return None


def _number(result: Mapping[str, Any]) -> float | None:
    """An instant vector element's value; None when absent, malformed or not finite."""
    value = _raw_number(result)
    return value if value is not None and math.isfinite(value) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _per_key(answer: list[dict[str, Any]] | None) -> tuple[dict[Key, float], dict[Key, float]]:
    """Per container, the highest finite value of its series, and apart from those the
    values that are no finite number (a container may have both: the finite one counts)."""
    found: dict[Key, float] = {}
    odd: dict[Key, float] = {}
    for result in answer or []:
        labels = result.get("metric") if isinstance(result, Mapping) else None
        value = _raw_number(result) if isinstance(result, Mapping) else None
        if not isinstance(labels, Mapping) or value is None:
            continue
        key = (_text(labels.get("namespace")), _text(labels.get("pod")),
               _text(labels.get("container")))
        if not all(key):
            continue
        if math.isfinite(value):
            found[key] = max(value, found.get(key, value))
        else:
            odd[key] = value
    return found, odd


def _profiles(answer: list[dict[str, Any]] | None) -> dict[tuple[str, str], str]:
    found = {}
    for result in answer or []:
        labels = result.get("metric") if isinstance(result, Mapping) else None
        if not isinstance(labels, Mapping):
            continue
        namespace, pod = _text(labels.get("namespace")), _text(labels.get("pod"))
        profile = _text(labels.get(PROFILE_LABEL))
        if namespace and pod and profile:
            found[(namespace, pod)] = profile
    return found


def _bytes(name: str, figure: tuple[dict[Key, float], dict[Key, float]], key: Key
           ) -> tuple[float | None, str | None]:
    """A memory figure of ``key``, or why it cannot be one."""
    found, odd = figure
    value = found.get(key)
    if value is None:
        return None, (f"{name} not a finite number" if key in odd else f"no {name} figure")
    if value <= 0:
        return None, f"{name} 0 bytes or below"
    if value < 1:
        return None, f"{name} below one byte"
    if value > MAX_BYTES:
        return None, f"{name} above 8 EiB"
    return value, None


def _optional_bytes(value: float | None, at_least: float = 0) -> float | None:
    """A figure that may be missing: kept only when it is one memory can have."""
    return value if value is not None and at_least <= value <= MAX_BYTES else None


def read(answers: Mapping[str, list[dict[str, Any]] | None]) -> Usage:
    """Every container of a pod with a profile annotation, a memory request and working-set
    samples in the window; partial answers leave the figures they lack as None. A container
    of such a pod whose request or working set is no memory at all (0, negative, not finite,
    below a byte, above 8 EiB) is left out and counted, with why."""
    profiles = _profiles(answers.get("profile"))
    figures = {name: _per_key(answers.get(name)) for name in
               ("request", "limit", "samples", "working_set_p95", "working_set_max",
                "above_request", "swap_max", "stall", "stall_peak")}
    found = []
    dropped: dict[tuple[str, str], int] = {}
    samples_found, samples_odd = figures["samples"]
    for key in sorted(samples_found.keys() | samples_odd.keys()):
        profile = profiles.get(key[:2])
        if profile is None:  # not a reshaped pod: not swapwise's to judge
            continue
        samples = samples_found.get(key)
        request, problem = _bytes("memory request", figures["request"], key)
        p95, ws_problem = _bytes("working set", figures["working_set_p95"], key)
        problem = problem or ws_problem or (
            "working-set sample count not a finite number" if samples is None else
            "no working-set samples" if samples < 1 else None)
        if problem is not None or request is None or p95 is None or samples is None:
            why = problem or "unreadable"
            dropped[(profile, why)] = dropped.get((profile, why), 0) + 1
            continue
        limit = _optional_bytes(figures["limit"][0].get(key), at_least=request)
        ws_max = _optional_bytes(figures["working_set_max"][0].get(key)) or p95
        above = figures["above_request"][0].get(key)
        found.append(ContainerUsage(
            namespace=key[0], pod=key[1], container=key[2], profile=profile,
            request=request, limit=limit, samples=int(min(samples, MAX_BYTES)),
            working_set_p95=p95, working_set_max=max(ws_max, p95),
            above_request=_share(above),
            swap_max=_optional_bytes(figures["swap_max"][0].get(key)),
            stall=_share(figures["stall"][0].get(key)),
            stall_peak=_share(figures["stall_peak"][0].get(key)),
        ))
    return Usage(found, dropped)


def containers(answers: Mapping[str, list[dict[str, Any]] | None]) -> list[ContainerUsage]:
    """:func:`read`'s containers."""
    return read(answers).containers


def _share(value: float | None) -> float | None:
    """A share of time, within 0-1: a counter's rate can overshoot 1 by scrape jitter."""
    return None if value is None else min(max(value, 0.0), 1.0)
