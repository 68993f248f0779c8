"""What the real-node scenarios share: the sandbox workload, a run of pods and what it
showed, the node's shape, and the CLI calls (plan, tune, audit) they check against.

Used by the CI tier (test_real_node.py) and the benchmarks (bench/); nothing here asserts.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.cluster import PROFILE_LABEL, ClusterError, ControlPlane, swapwise_executable
from tests.e2e.install import NAMESPACE, RELEASE
from tests.monitoring.prom import Prometheus
from tests.node.node import RealNode
from webhook.base.quantity import parse_bytes, parse_quantity
from webhook.engine.backing import PERMILLE_LABEL

REPO = Path(__file__).resolve().parents[2]
# make node-bench writes its own (build/node-bench/results.json), beside CI's.
RESULTS = REPO / os.environ.get("SWAPWISE_NODE_RESULTS", "build/node-e2e/results.json")

# The profiles of the scenarios: swapRatio 2 matches the node (swap = 2 x RAM); the
# aggressive ones ask for a tenth of the limit, far past what the node's swap can hold:
# with swap backing (the default) the scheduler refuses them the node, without it they
# land and overcommit it (the control, in bench/).
BACKED = {"placement": {"swapBacking": "required"}}
PROFILES: dict[str, Any] = {
    "sandbox": {"swapRatio": 2, **BACKED},
    # 2x: the wake-up benchmark's middle density (bench/test_wakeup.py).
    "double": {"swapRatio": 1, **BACKED},
    # The same two densities with swap backing off: the wake-up benchmark's zram cells (zram
    # backs nothing by default, so backed profiles would place no pod on a zram-only node).
    "double-unbacked": {"swapRatio": 1, "placement": {"swapBacking": "off"}},
    "sandbox-unbacked": {"swapRatio": 2, "placement": {"swapBacking": "off"}},
    # "tuned" starts as "sandbox" does; the hot tune benchmark replaces its ratio by what
    # `swapwise tune` recommends, as a user would, and runs the same pods again.
    "tuned": {"swapRatio": 2, **BACKED},
    "aggressive": {"requestRatio": 0.1, **BACKED},
    "unbacked": {"requestRatio": 0.1, "placement": {"swapBacking": "off"}},
}

PAGE = 4096
SWAP_NODE_ANNOTATION = "swapwise.io/swap-node"

# The sandbox: written Guaranteed (request == limit), holding a cold set it allocated once
# and a hot set it keeps touching. cold + hot + runtime ~ 115 MiB of a 256Mi limit: the pods
# the node packs with swapwise (3x) hold ~1.3x the RAM it has for pods, so only swap keeps
# them alive, and the emulated guest writes a third less than with the 150 MiB cold sets of
# the runs before 2026-12-07 (the ratios and the kubelet's formula do not depend on it).
LIMIT = "256Mi"
LIMIT_BYTES = 256 * 1024**2
COLD_MIB, HOT_MIB = 96, 16
CPU = "50m"  # small, so CPU never binds before memory on a 2-vCPU node
HOLD_SECONDS = 120  # "stay Running for at least 2 minutes"
# The density runs' sandbox has no CPU limit: Burstable, its memory request == limit all the
# same (what swapwise reshapes, and what the kubelet grants no swap). The kernel charges a
# pod for the reclaim its own page faults do; on the emulated CPU one pod of 18 under a 50m
# limit ran 82 CPU-seconds over its quota while the node filled, then sat throttled with its
# allocation unfinished, paying the debt back at 50m (about 25 minutes). That was the
# start-up's spread of 77 to 781 s; without the limit it took 75-142 s (2026-12-07).
DENSITY_SANDBOX: dict[str, Any] = {"cpu_limit": False}


def sandbox_pod(name: str, namespace: str, cold_mib: int = COLD_MIB, hot_mib: int = HOT_MIB,
                tick: str | None = None, cpu_limit: bool = True,
                listen: int | None = None, fill: float | None = None) -> dict[str, Any]:
    """The sandbox, memory request == limit (what swapwise reshapes). With ``cpu_limit`` it is
    Guaranteed; without, it asks for 50m and may use any CPU that is free (Burstable).
    ``listen``: the node port its ``GET /wake`` answers on (tests/node/wakeup.py)."""
    resources = {"cpu": CPU, "memory": LIMIT}
    limits = dict(resources) if cpu_limit else {"memory": LIMIT}
    args = ["sandbox", "-cold-mib", str(cold_mib), "-hot-mib", str(hot_mib)]
    if listen is not None:
        args += ["-listen", f":{listen}"]
    if fill is not None:  # pages that compress as real memory does (zram)
        args += ["-fill", str(fill)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "sandbox"}},
        "spec": {
            "hostNetwork": True,  # the workload needs no network: no pod IP to set up
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "sandbox",
                "image": "localhost/swapwise/workload:v1",
                "imagePullPolicy": "Never",
                "args": args + (["-tick", tick] if tick else []),
                "resources": {"requests": dict(resources), "limits": limits},
            }],
        },
    }


# --------------------------------------------------------------------------- helpers


def node_shape(node: RealNode) -> dict[str, int]:
    status = node.node()["status"]
    return {
        "memory": parse_bytes(status["capacity"]["memory"]),
        "allocatable": parse_bytes(status["allocatable"]["memory"]),
        "swap": int(status["nodeInfo"]["swap"]["capacity"]),
        "cpu_milli": int(parse_quantity(status["allocatable"]["cpu"]) * 1000),
    }


def free_memory(node: RealNode) -> int:
    """The node's allocatable memory less what the pods already bound there request (the
    node agent's, say): what the scheduler has left for a scenario's pods."""
    cp = node.cp
    taken = 0
    for pod in cp.get_json("pods", "-A", "--field-selector", f"spec.nodeName={node.name}")[
            "items"]:
        if pod["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod["spec"]["containers"]:
            memory = c.get("resources", {}).get("requests", {}).get("memory")
            taken += parse_bytes(memory) if memory else 0
    return node_shape(node)["allocatable"] - taken


def create_namespace(cp: ControlPlane, name: str, profile: str | None) -> None:
    cp.create_namespace(name, {PROFILE_LABEL: profile} if profile else {})


def pods(cp: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cp.get_json("pods", "-n", namespace)["items"]
    return items


def running(pod: dict[str, Any]) -> bool:
    return bool(pod["status"].get("phase") == "Running" and all(
        "running" in c.get("state", {}) for c in pod["status"].get("containerStatuses") or [{}]))


def kubelet_rejections(cp: ControlPlane, namespace: str) -> set[str]:
    """UIDs of the pods of ``namespace`` the kubelet refused at admission for their node
    affinity: it records a Warning Event with reason NodeAffinity for each
    (``Kubelet.rejectPod``)."""
    items = cp.get_json("events", "-n", namespace, "--field-selector",
                        "involvedObject.kind=Pod,reason=NodeAffinity")["items"]
    return {e["involvedObject"].get("uid", "") for e in items
            if e.get("source", {}).get("component") == "kubelet"
            or e.get("reportingComponent") == "kubelet"}


def rejected_at_kubelet_restart(pod: dict[str, Any], rejections: set[str]) -> bool:
    """The kubelet re-admits every pod it finds when it starts, node affinity included
    (kubernetes/kubernetes#124586): a running pod whose required terms the node's labels no
    longer meet is refused, and its containers are stopped. The phase it ends in is
    ``Failed`` with reason NodeAffinity, or, when the containers exit 0 on SIGTERM and the
    kubelet's pod worker writes the last status, ``Succeeded`` (a CI run saw that): the
    kubelet's Event is what names the cause either way."""
    status = pod["status"]
    if status.get("phase") not in ("Failed", "Succeeded"):
        return False
    return bool(status.get("reason") == "NodeAffinity"
                or pod["metadata"].get("uid") in rejections)


def states(pods_: list[dict[str, Any]]) -> list[str]:
    """Each pod's phase and containers' states, short, for a failure message."""
    out = []
    for pod in pods_:
        status = pod["status"]
        containers = []
        for c in status.get("containerStatuses") or []:
            state = next(iter(c.get("state", {})), "?")
            reason = c.get("state", {}).get("terminated", {}).get("reason")
            containers.append(
                f"{state}{'/' + reason if reason else ''}"
                f"(last {c.get('lastState', {}).get('terminated', {}).get('reason', '-')}, "
                f"restarts {c.get('restartCount', 0)})")
        phase = status.get("phase")
        if status.get("reason"):
            phase = f"{phase}/{status['reason']}"
        out.append(f"{pod['metadata']['name']}: {phase} {' '.join(containers)}")
    return out


def container_id(pod: dict[str, Any]) -> str:
    cid: str = pod["status"]["containerStatuses"][0]["containerID"]
    return cid.split("://", 1)[1]


def oom_killed(pod: dict[str, Any]) -> bool:
    """The kubelet saw a container of this pod OOM-killed (now or as its last state)."""
    return any(
        state.get("terminated", {}).get("reason") == "OOMKilled"
        for c in pod["status"].get("containerStatuses") or []
        for state in (c.get("state", {}), c.get("lastState", {}))
    )


def restarted(pod: dict[str, Any]) -> bool:
    return any(c.get("restartCount") for c in pod["status"].get("containerStatuses") or [])


def evicted(pod: dict[str, Any]) -> bool:
    return bool(pod["status"].get("reason") == "Evicted")


def placement(cp: ControlPlane, namespace: str, count: int, node: RealNode) -> tuple[int, int]:
    """Wait until the scheduler has decided every pod; return (placed, unschedulable)."""

    def decided() -> tuple[int, int] | None:
        items = pods(cp, namespace)
        placed = sum(1 for p in items if p["spec"].get("nodeName"))
        refused = sum(1 for p in items if any(
            c["type"] == "PodScheduled" and c["status"] == "False" and c.get("reason") ==
            "Unschedulable" for c in p["status"].get("conditions") or []))
        return (placed, refused) if len(items) == count and placed + refused == count else None

    what = f"the scheduler to place the pods of {namespace}"
    result: tuple[int, int] = node.wait_for(decided, 180, what=what)
    return result


def hot_ops(cp: ControlPlane, namespace: str, name: str) -> float | None:
    """The last hot-loop throughput a pod reported (kubectl logs: API server -> kubelet)."""
    out = cp.kubectl("logs", "-n", namespace, name, "--tail=5", check=False).stdout
    rates = [json.loads(line)["hot_ops_per_s"] for line in out.splitlines()
             if line.startswith("{") and '"phase":"running"' in line]
    return rates[-1] if rates else None


def swap_used(node: RealNode) -> int:
    meminfo = node.fresh_status()["meminfo"]
    return (int(meminfo["SwapTotal"]) - int(meminfo["SwapFree"])) * 1024


def kubelet_swap_metrics(node: RealNode, namespace: str) -> dict[str, float]:
    """The kubelet's own swap figures (``/metrics/resource``, alpha metrics since 1.30):
    the node's swap in use, and the sum and count of this namespace's containers."""
    node_usage, containers = 0.0, []
    for line in node.kubelet_get("/metrics/resource").splitlines():
        if line.startswith("node_swap_usage_bytes"):
            node_usage = float(line.split()[1])
        elif line.startswith("container_swap_usage_bytes{") and f'namespace="{namespace}"' in line:
            containers.append(float(line.split("}", 1)[1].split()[0]))
    return {"node_swap_usage_bytes": node_usage,
            "container_swap_usage_bytes_sum": sum(containers),
            "containers_reported": len(containers)}


def guest_oom_kills(node: RealNode) -> int:
    return int(node.status()["vmstat"]["oom_kill"])


def permille_label(node: RealNode) -> int | None:
    value = node.node()["metadata"].get("labels", {}).get(PERMILLE_LABEL)
    return None if value is None else int(value)


def required_need(pod: dict[str, Any]) -> int | None:
    """The need the webhook wrote into the pod's required node affinity (Gt need - 1)."""
    terms = (pod["spec"].get("affinity", {}).get("nodeAffinity", {})
             .get("requiredDuringSchedulingIgnoredDuringExecution", {})
             .get("nodeSelectorTerms", []))
    needs = {int(e["values"][0]) + 1 for term in terms for e in term.get("matchExpressions", [])
             if e["key"] == PERMILLE_LABEL and e["operator"] == "Gt"}
    assert len(needs) <= 1, needs
    return needs.pop() if needs else None


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it refused the pod every node, else None."""
    for condition in pod["status"].get("conditions") or []:
        if (condition["type"] == "PodScheduled" and condition["status"] == "False"
                and condition.get("reason") == "Unschedulable"):
            return str(condition.get("message", ""))
    return None


def audit(cp: ControlPlane) -> dict[str, Any]:
    """``swapwise audit -o json`` with the chart's policy (exit 1: something needs action)."""
    policy = cp.get_json("configmap", f"{RELEASE}-policy", "-n", NAMESPACE)["data"]["policy.yaml"]
    policy_file = cp.workdir / "audit-policy.yaml"
    policy_file.write_text(policy)
    proc = subprocess.run([swapwise_executable(), "audit", "--kubeconfig", str(cp.kubeconfig),
                           "--policy", str(policy_file), "-o", "json"],
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def delete_namespace(cp: ControlPlane, node: RealNode, namespace: str) -> None:
    cp.kubectl("delete", "namespace", namespace, "--wait=false")
    node.wait_for(lambda: cp.kubectl("get", "namespace", namespace, check=False).returncode != 0,
                  600, what=f"namespace {namespace} and its pods to be gone")


def plan(node_shape_: dict[str, int], profile: str, node_workdir: Path) -> dict[str, Any]:
    """``swapwise plan`` for the sandbox pod on this node, with the chart's profiles."""
    policy = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy", "profiles": PROFILES}
    manifest = yaml.safe_dump(sandbox_pod("sandbox", "plan"))
    policy_file = node_workdir / "plan-policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy))
    argv = [swapwise_executable(), "plan", "-f", "-", "--policy", str(policy_file),
            "--profile", profile, "--node-memory", str(node_shape_["memory"]),
            "--node-swap", str(node_shape_["swap"]),
            "--node-cpu", f"{node_shape_['cpu_milli']}m",
            "--allocatable-memory", str(node_shape_["allocatable"]), "-o", "json"]
    proc = subprocess.run(argv, input=manifest, capture_output=True, text=True, check=True)
    workload: dict[str, Any] = json.loads(proc.stdout)["workloads"][0]
    return workload


# `swapwise tune` over the scenarios' own minutes: the cadvisor job scrapes every 15 s, so six
# samples a container come within two minutes, and a rate over 1 m has four (users keep the
# defaults: 10 samples, 5m steps and rates, over days).
TUNE_RATE_SECONDS = 60
TUNE_ARGS = ("--step", "15s", "--rate-interval", f"{TUNE_RATE_SECONDS}s")
# tune decides once the median container has this many samples (15 s apart): 1.5 minutes
# for the calm pods, whose working sets are flat; five minutes for the hot ones: a cold run's
# first decision, two minutes after every hot pod worked, saw working set p95 95 % of the
# request and stall p95 2.5 % (keep), where other runs saw 113-128 % and 15-22 %.
MIN_SAMPLES = 6
HOT_MIN_SAMPLES = 20


def tune(cp: ControlPlane, prom: Prometheus, since: float, output: str = "json",
         save: str | None = None, min_samples: int = MIN_SAMPLES) -> str:
    """``swapwise tune`` against the suite's Prometheus with the chart's policy, over the
    time since ``since`` (a monotonic time) but its first rate interval: each stall share is
    a rate over the interval before its step, so none reaches back before ``since`` (the
    pods' start-up). Prometheus' answers saved as build/node-e2e/tune-``save``.json."""
    policy = cp.get_json("configmap", f"{RELEASE}-policy", "-n", NAMESPACE)["data"]["policy.yaml"]
    policy_file = cp.workdir / "tune-policy.yaml"
    policy_file.write_text(policy)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)  # a fresh clone has no build/
    window = f"{max(15, math.ceil(time.monotonic() - since) - TUNE_RATE_SECONDS)}s"
    proc = subprocess.run([swapwise_executable(), "tune", "--prometheus", prom.url,
                           "--policy", str(policy_file), "--window", window,
                           *TUNE_ARGS, "--min-samples", str(min_samples), "-o", output,
                           *(["--save-answers", str(RESULTS.parent / f"tune-{save}.json")]
                             if save else [])],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "are not all in Prometheus" not in proc.stderr:
        # Only missing samples get better by waiting; any other failure ends the wait.
        raise ClusterError(f"swapwise tune failed: {proc.stderr}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def tuned(node: RealNode, prom: Prometheus, since: float, profile: str, timeout: float,
          save: str, min_samples: int = MIN_SAMPLES) -> dict[str, Any]:
    """``tune``'s recommendation for ``profile`` once it has the samples to make one."""
    last: list[dict[str, Any]] = []

    def decided() -> dict[str, Any] | None:
        report = json.loads(tune(node.cp, prom, since, save=save, min_samples=min_samples))
        [found] = [r for r in report["recommendations"] if r["profile"] == profile]
        last[:] = [found]
        return found if found["action"] != "insufficient-data" else None

    result: dict[str, Any] = node.wait_for(decided, timeout, interval=20,
                                           what=f"swapwise tune to decide on {profile}",
                                           detail=lambda: json.dumps(last, indent=1))
    return result


def recommended_swap_ratio(recommendation: dict[str, Any]) -> float:
    """The swapRatio ``tune`` recommends, or the profile's own when it says keep."""
    new = recommendation["recommended"]
    return float(new["swapRatio"] if new else recommendation["swapRatio"])




class Run:
    """One density run: its namespace, pod count and what was observed."""

    def __init__(self, node: RealNode, namespace: str, profile: str | None, count: int,
                 workload: dict[str, Any] | None = None, listen_from: int | None = None
                 ) -> None:
        self.node, self.cp = node, node.cp
        self.namespace, self.profile, self.count = namespace, profile, count
        self.workload = workload or {}  # sandbox_pod's keywords: the calm sandbox by default
        # Pod i answers GET /wake on the node's port listen_from + i (hostNetwork).
        self.listen_from = listen_from
        self.placed = self.refused = 0
        self.oom_start = 0

    def start(self) -> None:
        create_namespace(self.cp, self.namespace, self.profile)
        self.oom_start = guest_oom_kills(self.node)
        items = [sandbox_pod(f"sandbox-{i:02d}", self.namespace, **self.workload,
                             listen=None if self.listen_from is None else self.listen_from + i)
                 for i in range(self.count)]
        self.cp.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        self.placed, self.refused = placement(self.cp, self.namespace, self.count, self.node)

    def placed_pods(self) -> list[dict[str, Any]]:
        return [p for p in pods(self.cp, self.namespace) if p["spec"].get("nodeName")]

    def wake_port(self, pod: dict[str, Any]) -> int:
        """The node port ``pod`` (sandbox-NN of this run) answers GET /wake on."""
        assert self.listen_from is not None, "a run without listen_from serves no /wake"
        return self.listen_from + int(pod["metadata"]["name"].rsplit("-", 1)[1])

    def counts(self) -> dict[str, int]:
        placed = self.placed_pods()
        return {
            "placed": len(placed),
            "running": sum(running(p) for p in placed),
            # The guest kernel's count is the truth (a restarted container's cgroup is gone);
            # pods the kubelet marked OOMKilled are a lower bound of it.
            "oom_kills": max(sum(oom_killed(p) for p in placed),
                             guest_oom_kills(self.node) - self.oom_start),
            "evictions": sum(evicted(p) for p in placed),
            "restarts": sum(c.get("restartCount", 0) for p in placed
                            for c in p["status"].get("containerStatuses") or []),
        }

    def wait_all_working(self, timeout: float) -> None:
        """Every placed pod Running and past its allocation (it reported a hot-loop rate)."""

        def working() -> bool:
            placed = self.placed_pods()
            if not all(running(p) for p in placed):
                return False
            return all(hot_ops(self.cp, self.namespace, p["metadata"]["name"]) for p in placed)

        try:
            self.node.wait_for(working, timeout, interval=10,
                               what=f"all pods of {self.namespace} Running and allocated")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.progress()}") from None

    def timeline(self) -> dict[str, float]:
        """Seconds from the first pod's creation to the last pod scheduled, the last pod's
        sandbox ready and the last container started (the API's times, to the second): where
        a slow start went (a cold CI run's six pods took 586 s against 119 s warm)."""
        placed = self.placed_pods()

        def at(value: str | None) -> float | None:
            return dt.datetime.fromisoformat(value).timestamp() if value else None

        def condition(pod: dict[str, Any], kind: str) -> float | None:
            return next((at(c.get("lastTransitionTime")) for c in pod["status"].get(
                "conditions") or [] if c["type"] == kind and c["status"] == "True"), None)

        created = min(at(p["metadata"]["creationTimestamp"]) or 0.0 for p in placed)
        marks = {
            "scheduled_s": [condition(p, "PodScheduled") for p in placed],
            "sandbox_ready_s": [condition(p, "PodReadyToStartContainers") for p in placed],
            "containers_started_s": [at(c.get("state", {}).get("running", {}).get("startedAt"))
                                     for p in placed
                                     for c in p["status"].get("containerStatuses") or []],
        }
        return {name: round(max(times) - created, 1) for name, values in marks.items()
                if (times := [t for t in values if t is not None])}

    def progress(self) -> str:
        """Each placed pod's state and last progress line, for a failure message: which pods
        never reported, and how far they got."""
        lines, placed = [], self.placed_pods()
        for pod, state in zip(placed, states(placed), strict=True):
            name = pod["metadata"]["name"]
            out = self.cp.kubectl("logs", "-n", self.namespace, name, "--tail=1",
                                  check=False).stdout.strip()
            lines.append(f"{state}; last line: {out or '(none)'}")
        return "----- pods -----\n" + "\n".join(lines)

    def swap_current(self) -> int:
        """Swap in use by this run's containers, from their cgroups in the guest."""
        uids = {f"/pod{p['metadata']['uid']}/" for p in self.placed_pods()}
        return sum(int(files["memory.swap.current"])
                   for path, files in self.node.fresh_status()["cgroups"].items()
                   if any(uid in f"/{path}" for uid in uids) and files["memory.max"] != "max")

    def backing_margins(self) -> dict[str, int]:
        """Per running reshaped container: its ``memory.swap.max`` as the guest's cgroup has
        it, minus what it holds above its request (limit - request). Backed: >= 0."""
        status = self.node.fresh_status()
        margins = {}
        for pod in self.placed_pods():
            resources = pod["spec"]["containers"][0]["resources"]
            request = parse_bytes(resources["requests"]["memory"])
            limit = parse_bytes(resources["limits"]["memory"])
            cgroup = self.node.container_cgroup(status, pod["metadata"]["uid"], container_id(pod))
            assert cgroup and cgroup["memory.swap.max"].isdigit(), (pod["metadata"]["name"],
                                                                     cgroup)
            margins[pod["metadata"]["name"]] = int(cgroup["memory.swap.max"]) - (limit - request)
        return margins

    def median_hot_ops(self) -> float:
        rates = [hot_ops(self.cp, self.namespace, p["metadata"]["name"])
                 for p in self.placed_pods()]
        return float(statistics.median(r for r in rates if r))

    def observe(self, seconds: float, stop: Callable[[dict[str, int]], bool] | None = None
                ) -> dict[str, int]:
        """Poll the counts for ``seconds`` (or until ``stop`` says so); return the worst seen."""
        deadline = time.monotonic() + seconds
        worst = self.counts()
        while time.monotonic() < deadline and not (stop and stop(worst)):
            self.node.check_alive()
            time.sleep(10)
            now = self.counts()
            worst = {k: (min if k in ("running", "placed") else max)(worst[k], now[k])
                     for k in now}
        return worst

    def __enter__(self) -> Run:
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Always remove the run's namespace: the next run needs the node empty."""
        delete_namespace(self.cp, self.node, self.namespace)




# The hot sandbox: the same 256Mi limit, but 110 MiB it touches twice a second (40 MiB cold).
# As many as swapRatio 2 packs (19 on this node) need ~2.2 GiB resident where the node has
# ~1.5 GiB for pods: their hot pages go to swap and come back, and they wait for them. No CPU
# limit: a container held to 50m runs 5 % of the time and so cannot wait for memory much
# longer than that (CPU-limited, the same pods waited 0.3 % of the time at a node PSI of
# ~22 %, and tune kept: docs/tune.md). Two passes a second, not ten: 19 of them then take
# about a quarter of the two vCPUs while their pages are resident (a pass once a second
# waited 1.4 % of the time at the median, 11.6 % at p95: too near tune's 10 %).
HOT_SANDBOX: dict[str, Any] = {"cold_mib": 40, "hot_mib": 110, "tick": "500ms",
                               "cpu_limit": False}


def previewed_request(cp: ControlPlane, namespace: str) -> int:
    """The memory request a server-side dry run of the hot sandbox gets in ``namespace``."""
    pod = sandbox_pod("preview", namespace, **HOT_SANDBOX)
    out = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                     input=json.dumps(pod)).stdout
    return parse_bytes(json.loads(out)["spec"]["containers"][0]["resources"]["requests"]["memory"])




def small_pod(name: str, namespace: str) -> dict[str, Any]:
    """A pod that only has to be scheduled: a small Guaranteed pause container."""
    resources = {"cpu": "10m", "memory": "32Mi"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"hostNetwork": True, "automountServiceAccountToken": False,
                 "enableServiceLinks": False, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "pause", "image": "localhost/swapwise/pause:v1",
                                 "imagePullPolicy": "Never",
                                 "resources": {"requests": resources, "limits": resources}}]},
    }


def evicted_through_the_api(pod: dict[str, Any]) -> bool:
    """Evicted by a client of the Eviction API (what swapwise must never do), not by the
    kubelet's own pressure eviction."""
    return any(c["type"] == "DisruptionTarget" and c.get("reason") == "EvictionByEvictionAPI"
               for c in pod["status"].get("conditions") or [])


