"""An hour of what a cluster's Prometheus holds about reshaped pods, as OpenMetrics text for
``promtool tsdb create-blocks-from openmetrics``: the series kube-state-metrics and the
kubelet's cAdvisor export, with their real names and labels (tests/node scrapes the real
ones), for ``swapwise tune`` against a real Prometheus without waiting an hour.

The pods (one container each, 256Mi limit; the figures are chosen, the shapes are real):

- ``calm``: 4 pods at swapRatio 2 (request limit/3), working set 45-55 MiB (about 60 % of
  the request), waiting for memory 0.5 % of the time;
- ``hot``: 4 pods at requestRatio 0.25 (64Mi), working set 58-82 MiB around the request,
  waiting 30 % of the time; one container restarts halfway (new series, counter from 0);
- ``thin``: 1 pod, too few to judge;
- a pod of ``calm`` in ``ci-heavy``, a namespace that overrides the profile;
- a pod without the annotation (not reshaped), and a NaN among the swap samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from webhook.analysis.usage import PROFILE_LABEL

MI = 1024 * 1024
LIMIT = 256 * MI
STEP = 30  # seconds between samples, a common scrape interval
SECONDS = 3600


@dataclass
class Pod:
    namespace: str
    name: str
    profile: str | None
    request: int
    working_set: tuple[int, int]  # low, high (MiB): a sine between them
    stall: float  # share of time waiting for memory
    restart_at: float | None = None  # share of the hour
    swap_mib: float = 100.0
    nan_swap_at: int | None = None
    uid: str = field(default="")

    def ws(self, i: int) -> float:
        low, high = self.working_set
        phase = math.sin(i / 7 + len(self.name))
        return (low + (high - low) * (phase + 1) / 2) * MI


def pods() -> list[Pod]:
    calm = [Pod("calm-a", f"calm-{i}", "calm", LIMIT // 3, (45, 55), 0.005) for i in range(4)]
    calm[1].nan_swap_at = 40
    hot = [Pod("hot-a", f"hot-{i}", "hot", LIMIT // 4, (58, 82), 0.30) for i in range(4)]
    hot[0].restart_at = 0.5
    return [*calm, *hot,
            Pod("thin-a", "thin-0", "thin", LIMIT // 3, (40, 50), 0.0),
            Pod("ci-heavy", "calm-override", "calm", LIMIT * 3 // 4, (45, 55), 0.005),
            Pod("plain", "not-reshaped", None, LIMIT, (120, 130), 0.0)]


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def openmetrics(end: int) -> str:
    """The hour ending at ``end`` (Unix seconds), every pod of :func:`pods`."""
    times = [end - SECONDS + i * STEP for i in range(SECONDS // STEP + 1)]
    families: dict[str, tuple[str, list[str]]] = {
        "kube_pod_annotations": ("gauge", []),
        "kube_pod_container_resource_requests": ("gauge", []),
        "kube_pod_container_resource_limits": ("gauge", []),
        "container_memory_working_set_bytes": ("gauge", []),
        "container_memory_swap": ("gauge", []),
        "container_pressure_memory_waiting_seconds_total": ("unknown", []),
    }

    def add(name: str, labels: str, values: Iterator[tuple[int, float]]) -> None:
        families[name][1].extend(f"{name}{labels} {'NaN' if math.isnan(v) else repr(v)} {t}"
                                 for t, v in values)

    for n, pod in enumerate(pods()):
        uid = f"00000000-0000-0000-0000-{n:012d}"
        ksm = dict(namespace=pod.namespace, pod=pod.name, uid=uid)
        if pod.profile:
            add("kube_pod_annotations", _labels(**ksm, **{PROFILE_LABEL: pod.profile}),
                ((t, 1.0) for t in times))
        else:
            add("kube_pod_annotations", _labels(**ksm), ((t, 1.0) for t in times))
        res = dict(ksm, container="sandbox", node="node-1", unit="byte")
        add("kube_pod_container_resource_requests", _labels(**res, resource="memory"),
            ((t, float(pod.request)) for t in times))
        add("kube_pod_container_resource_limits", _labels(**res, resource="memory"),
            ((t, float(LIMIT)) for t in times))
        split = len(times) if pod.restart_at is None else int(len(times) * pod.restart_at)
        for part, span in enumerate((times[:split], times[split:])):
            if not span:
                continue
            cadvisor = _labels(namespace=pod.namespace, pod=pod.name, container="sandbox",
                               id=f"/kubepods/burstable/pod{uid}/c{part}", image="workload")
            first = times.index(span[0])
            add("container_memory_working_set_bytes", cadvisor,
                ((t, pod.ws(first + i)) for i, t in enumerate(span)))
            add("container_memory_swap", cadvisor,
                ((t, math.nan if first + i == pod.nan_swap_at else pod.swap_mib * MI)
                 for i, t in enumerate(span)))
            add("container_pressure_memory_waiting_seconds_total", cadvisor,
                ((t, pod.stall * (t - span[0])) for t in span))
    lines = []
    for name, (kind, samples) in families.items():
        lines += [f"# TYPE {name} {kind}", *samples]
    return "\n".join([*lines, "# EOF", ""])


def above_request_share(pod: Pod) -> float:
    """The share of the hour's samples with the working set above the request."""
    count = SECONDS // STEP + 1
    return sum(pod.ws(i) > pod.request for i in range(count)) / count
