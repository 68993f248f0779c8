"""``swapwise plan`` and webhook.analysis.planner, checked against numbers computed by hand.

Mi = 1048576 bytes throughout. Each expected value is worked out in the comment above it,
so a wrong formula (swap share on allocatable, sidecars counted once, floats) fails here.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from webhook.analysis.planner import Node, PlanError, backing_applies, plan_pod, pod_request
from webhook.cli import main
from webhook.engine import reshape
from webhook.engine.pod import MalformedPod, PodView
from webhook.policy import default_policy, parse_policy
from webhook.profile import Profile

MI = 1024**2
GI = 1024**3
DEFAULT = default_policy().profiles["default"]  # swapRatio 2 -> requestRatio 1/3


def container(name: str, request: str | None = None, limit: str | None = None,
              cpu: str | None = None, **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if request is not None or cpu is not None:
        resources["requests"] = {k: v for k, v in (("memory", request), ("cpu", cpu)) if v}
    if limit is not None:
        resources["limits"] = {"memory": limit}
    return {"name": name, "image": "python", "resources": resources, **extra}


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None,
        **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": list(containers), **spec}
    if init:
        body["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": body}


def guaranteed_sandbox() -> dict[str, Any]:
    """2Gi memory and 100m CPU, requests == limits: a Guaranteed pod."""
    app = {"name": "app", "image": "python", "resources": {
        "requests": {"cpu": "100m", "memory": "2Gi"}, "limits": {"cpu": "100m", "memory": "2Gi"},
    }}
    return pod(app)


# --------------------------------------------------------------------- the two headline cases


def test_guaranteed_2gi_sandbox_default_profile_on_28gi_8cpu_node() -> None:
    node = Node(memory=28 * GI, swap=56 * GI, cpu=Fraction(8))
    result = plan_pod(reshape(guaranteed_sandbox(), DEFAULT), node)
    (app,) = result.containers
    # target(2Gi) = ceilMi(2048Mi / 3) = ceilMi(682.67Mi) = 683Mi; the limit stays 2Gi.
    assert (app.request_before, app.limit_before) == (2 * GI, 2 * GI)
    assert (app.request_after, app.limit_after) == (683 * MI, 2 * GI)
    assert app.changed and app.swap_eligible
    # share = 683Mi / 28Gi * 56Gi = 1366Mi; cold = 2048Mi - 683Mi = 1365Mi <= 1366Mi.
    assert app.swap_share == 1366 * MI
    assert app.cold == 1365 * MI
    assert app.fits is True
    # memory: 28672Mi // 2048Mi = 14 before, 28672Mi // 683Mi = 41 (41.98) after.
    assert (result.before.by_memory, result.after.by_memory) == (14, 41)
    # cpu: 8 / 0.1 = 80 either way; the kubelet's 110 pods never binds here.
    assert (result.before.by_cpu, result.after.by_cpu) == (80, 80)
    assert (result.before.per_node, result.after.per_node) == (14, 41)
    assert result.before.binds == result.after.binds == ("memory",)
    # 100 replicas: ceil(100 / 14) = 8 nodes before, ceil(100 / 41) = 3 after.
    assert (result.before.nodes_for(100), result.after.nodes_for(100)) == (8, 3)
    # node swap/RAM = 2; needed = 1365 / 683 (just under 2, thanks to the MiB round-up).
    assert result.swap_ratio == 2
    assert result.needed_swap_ratio == Fraction(1365, 683)
    assert result.fits is True


def test_public_benchmark_python_sandbox_100mi_2gi_on_30gi_node_with_375gi_swap() -> None:
    node = Node(memory=30 * GI, swap=375 * GI, cpu=Fraction(8))
    sandbox = pod(container("python", request="100Mi", limit="2Gi", cpu="100m"))
    result = plan_pod(reshape(sandbox, DEFAULT), node)
    (python,) = result.containers
    # request < limit: already swap-eligible, swapwise leaves it alone.
    assert not python.changed
    assert result.warnings == ()
    # share = 100Mi / 30Gi * 375Gi = 1250Mi; cold = 2048Mi - 100Mi = 1948Mi: does NOT fit.
    assert python.swap_share == 1250 * MI
    assert python.cold == 1948 * MI
    assert python.fits is False
    # node swap/RAM = 375/30 = 12.5; needed = 1948/100 = 19.48.
    assert result.swap_ratio == Fraction(25, 2)
    assert result.needed_swap_ratio == Fraction(1948, 100)
    assert result.fits is False
    # Smallest request that fits: 2048Mi / (1 + 12.5) = 151.7Mi -> 152Mi
    # (152Mi * 12.5 = 1900Mi >= 1896Mi cold; 151Mi * 12.5 = 1887.5Mi < 1897Mi).
    assert python.fit_request == 152 * MI
    # memory 30720Mi // 100Mi = 307; cpu 8 / 0.1 = 80; pods 110: CPU binds first.
    assert (result.after.by_memory, result.after.by_cpu, result.after.by_pods) == (307, 80, 110)
    assert result.after.per_node == 80
    assert result.after.binds == ("cpu",)


def test_decimal_30g_node_holds_fewer_100mi_pods_than_30gi() -> None:
    # 30G = 30e9 bytes; 30e9 // 104857600 = 286 (286.1), against 307 for 30Gi.
    node = Node(memory=30 * 10**9, swap=375 * 10**9, cpu=Fraction(8))
    result = plan_pod(reshape(pod(container("python", request="100Mi", limit="2Gi")), DEFAULT),
                      node)
    assert result.after.by_memory == 286
    # No CPU request: CPU never limits, the kubelet's 110 pods binds.
    assert result.after.by_cpu is None
    assert result.after.binds == ("pods",)
    # share = floor(104857600 * 375e9 / 30e9) = 1310720000 bytes (1250Mi, exact).
    assert result.containers[0].swap_share == 1_310_720_000


# --------------------------------------------------------------------------- pod requests


def test_pod_request_counts_sidecars_started_before_each_init_container() -> None:
    init = [
        container("setup", request="1Gi", limit="2Gi", cpu="500m"),
        container("proxy", request="128Mi", limit="256Mi", cpu="100m", restartPolicy="Always"),
        container("migrate", request="512Mi", limit="1Gi", cpu="2"),
    ]
    view = PodView.parse(pod(container("app", request="256Mi", limit="1Gi", cpu="250m"),
                             container("worker", request="256Mi", limit="1Gi", cpu="250m"),
                             init=init))
    # memory: regular + sidecar = 256 + 256 + 128 = 640Mi; init peaks: setup 1024
    # (no sidecar yet), proxy 128, migrate 512 + 128 = 640 -> max(640, 1024) = 1024Mi.
    assert pod_request(view, "memory") == 1024 * MI
    # cpu: 250m + 250m + 100m = 600m; init peaks 500m, 100m, 2000m + 100m -> 2.1 cores.
    assert pod_request(view, "cpu") == Fraction(21, 10)


def test_pod_request_sidecar_before_the_big_init_container_adds_to_it() -> None:
    init = [
        container("proxy", request="128Mi", limit="256Mi", restartPolicy="Always"),
        container("setup", request="1Gi", limit="2Gi"),
    ]
    view = PodView.parse(pod(container("app", request="256Mi", limit="1Gi"), init=init))
    # setup runs next to the already-started proxy: 1024 + 128 = 1152Mi > 256 + 128.
    assert pod_request(view, "memory") == 1152 * MI


def test_pod_request_takes_a_missing_request_from_the_limit() -> None:
    view = PodView.parse(pod(container("app", limit="1Gi"), container("b", request="100Mi")))
    assert pod_request(view, "memory") == 1124 * MI


def test_pod_level_request_replaces_the_container_sum() -> None:
    view = PodView.parse(pod(container("app", request="256Mi", limit="1Gi"),
                             resources={"requests": {"memory": "3Gi"}}))
    assert pod_request(view, "memory") == 3 * GI


# ------------------------------------------------------------------------- swap eligibility


def test_no_swap_node_gives_no_share_and_nothing_fits() -> None:
    node = Node(memory=16 * GI, swap=0, cpu=Fraction(4))
    result = plan_pod(reshape(guaranteed_sandbox(), DEFAULT), node)
    (app,) = result.containers
    # Still reshaped (the profile does not know the node), but the share is 0.
    assert app.request_after == 683 * MI
    assert app.swap_share == 0
    assert app.fits is False
    assert app.fit_request == 2 * GI  # without swap only request == limit holds it all


def test_skipped_critical_pod_uses_no_swap() -> None:
    node = Node(memory=16 * GI, swap=32 * GI, cpu=Fraction(4))
    critical = pod(container("app", request="256Mi", limit="1Gi"),
                   priorityClassName="system-node-critical")
    result = plan_pod(reshape(critical, DEFAULT), node)
    assert result.skipped == "critical pod"
    (app,) = result.containers
    assert not app.changed and not app.swap_eligible
    assert app.swap_share == 0 and app.fits is None
    assert result.fits is None and result.needed_swap_ratio is None
    assert result.before == result.after


def test_guaranteed_skip_profile_keeps_density() -> None:
    node = Node(memory=28 * GI, swap=56 * GI, cpu=Fraction(8))
    result = plan_pod(reshape(guaranteed_sandbox(), Profile("p", guaranteed_pods="skip")), node)
    assert result.skipped is not None
    assert result.before.by_memory == result.after.by_memory == 14
    assert result.containers[0].swap_eligible is False  # Guaranteed: no swap at all


def test_request_only_container_has_unbounded_cold_memory() -> None:
    node = Node(memory=16 * GI, swap=32 * GI, cpu=Fraction(4))
    result = plan_pod(reshape(pod(container("app", request="512Mi")), DEFAULT), node)
    (app,) = result.containers
    # Burstable, request without limit: share 512Mi * 2 = 1Gi, cold memory unbounded.
    assert app.swap_share == GI
    assert app.cold is None and app.fits is None


def test_tie_between_memory_and_cpu_reports_both() -> None:
    # 32Gi // 1Gi = 32 and 8 / 0.25 = 32.
    node = Node(memory=32 * GI, swap=64 * GI, cpu=Fraction(8))
    app = pod(container("app", request="1Gi", limit="3Gi", cpu="250m"))
    result = plan_pod(reshape(app, DEFAULT), node)
    assert result.after.binds == ("memory", "cpu")


def test_allocatable_memory_limits_scheduling_but_not_the_swap_share() -> None:
    node = Node(memory=32 * GI, swap=32 * GI, cpu=Fraction(8), allocatable_memory=30 * GI)
    result = plan_pod(reshape(pod(container("app", request="1Gi", limit="2Gi")), DEFAULT), node)
    assert result.after.by_memory == 30
    assert result.containers[0].swap_share == GI  # 1Gi / 32Gi * 32Gi


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"memory": 0, "swap": 0, "cpu": Fraction(1)}, "memory"),
    ({"memory": GI, "swap": -1, "cpu": Fraction(1)}, "swap"),
    ({"memory": GI, "swap": 0, "cpu": Fraction(0)}, "cpu"),
    ({"memory": GI, "swap": 0, "cpu": Fraction(1), "allocatable_memory": 2 * GI}, "allocatable"),
    ({"memory": GI, "swap": 0, "cpu": Fraction(1), "max_pods": 0}, "max pods"),
])
def test_node_shape_is_validated(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Node(**kwargs)


def test_malformed_pod_is_an_error_not_a_plan() -> None:
    node = Node(memory=GI, swap=GI, cpu=Fraction(1))
    bad = pod(container("app", request="lots", limit="2Gi"))
    with pytest.raises(MalformedPod, match="lots"):
        plan_pod(reshape(bad, DEFAULT), node)


# ------------------------------------------------------------------------------ swap backing


def profile(placement: str = "", **fields: Any) -> Profile:
    """A profile through the policy loader, as the webhook gets it."""
    body = {**fields, **({"placement": yaml.safe_load(placement)} if placement else {})}
    policy = parse_policy(yaml.safe_dump({"apiVersion": "swapwise.io/v1alpha1",
                                          "kind": "SwapPolicy", "profiles": {"p": body}}))
    return policy.profiles["p"]


def test_a_node_with_little_swap_backs_no_reshaped_pod_and_fits_none() -> None:
    # The node: 1Gi of swap on 64Gi of RAM is a swap node, at 15 per mille
    # (1000 * 1Gi / 64Gi = 15.6): a pod reshaped for swapRatio 2 needs 1999.
    node = Node(memory=64 * GI, swap=GI, cpu=Fraction(16))
    result = plan_pod(reshape(guaranteed_sandbox(), DEFAULT), node)
    assert (result.backing.need, result.backing.node_permille) == (1999, 15)
    assert result.backing.applies and not result.backing.backed and result.backing.refused
    # By memory 65536Mi // 683Mi = 95 would fit; the scheduler places none.
    assert result.after.by_memory == 95
    assert (result.after.per_node, result.after.binds) == (0, ("backing",))
    assert result.after.nodes_for(100) is None
    assert result.before.per_node == 32 and not result.before.unbacked  # Guaranteed: no need


@pytest.mark.parametrize(("swap", "backed"), [(999 * GI, True), (999 * GI - 1, False)])
def test_a_1mi_request_under_a_1000x_limit_needs_999000_per_mille(swap: int, backed: bool) -> None:
    # requestRatio 0.001, minRequest 1Mi: limit 1000Mi -> request ceilMi(1Mi) = 1Mi.
    # need = ceil(1000 * 999Mi / 1Mi) = 999000; the node's 1000 * 999Gi / 1Gi = 999000
    # exactly backs it, one byte less of swap (998999.99 -> 998999) does not.
    tiny = profile(requestRatio=0.001, minRequest="1Mi")
    result = plan_pod(reshape(pod(container("app", request="1000Mi", limit="1000Mi")), tiny),
                      Node(memory=GI, swap=swap, cpu=Fraction(8)))
    assert result.containers[0].request_after == MI
    assert result.backing.need == 999000
    assert result.backing.node_permille == (999000 if backed else 998999)
    assert result.backing.backed is backed
    assert (result.after.per_node == 0) is not backed


def test_need_is_over_changed_containers_init_and_sidecar_included() -> None:
    sidecar = container("proxy", request="3Gi", limit="3Gi", restartPolicy="Always")
    init = container("setup", request="1Gi", limit="1Gi")
    untouched = container("tool", request="100Mi", limit="2Gi")  # needs 19480, not changed
    p = pod(container("app", request="2Gi", limit="2Gi"), untouched, init=[init, sidecar])
    # app 2Gi -> 683Mi: ceil(1000 * 1365 / 683) = 1999; setup 1Gi -> 342Mi:
    # ceil(1000 * 682 / 342) = 1995; proxy 3Gi -> 1Gi: 1000 * 2Gi / 1Gi = 2000 exactly.
    at_2000 = plan_pod(reshape(p, DEFAULT), Node(memory=1000 * MI, swap=2000 * MI, cpu=Fraction(8)))
    assert [c.changed for c in at_2000.containers] == [True, True, True, False]
    assert at_2000.backing.need == 2000 and at_2000.backing.backed
    at_1999 = plan_pod(reshape(p, DEFAULT), Node(memory=1000 * MI, swap=1999 * MI, cpu=Fraction(8)))
    assert at_1999.backing.node_permille == 1999 and not at_1999.backing.backed
    assert at_1999.after.per_node == 0


def test_a_profile_without_required_placement_is_not_held_to_backing() -> None:
    node = Node(memory=64 * GI, swap=GI, cpu=Fraction(16))
    for mode in ("preferred", "none"):
        loose = profile(f"{{mode: {mode}}}")
        assert not backing_applies(loose)
        result = plan_pod(reshape(guaranteed_sandbox(), loose), node)
        assert result.backing.off == f"placement.mode: {mode}"
        assert not result.backing.applies and not result.backing.backed
        # Not enforced: counted on resources alone, as before backing existed.
        assert (result.after.per_node, result.after.binds) == (95, ("memory",))
    assert backing_applies(DEFAULT)


def test_swap_backing_off_is_counted_on_resources_alone() -> None:
    off = profile("{swapBacking: 'off'}")
    assert not backing_applies(off)
    result = plan_pod(reshape(guaranteed_sandbox(), off),
                      Node(memory=64 * GI, swap=GI, cpu=Fraction(16)))
    assert result.backing.off == "placement.swapBacking: off"
    assert result.after.per_node == 95


def test_pods_the_webhook_gives_no_swap_node_placement_are_not_held_to_backing() -> None:
    node = Node(memory=64 * GI, swap=GI, cpu=Fraction(16))
    pinned = guaranteed_sandbox()
    pinned["spec"]["nodeName"] = "n1"
    result = plan_pod(reshape(pinned, DEFAULT), node)
    assert result.backing.need == 1999  # reshaped all the same
    assert result.backing.off == "no swap-node placement: spec.nodeName is set"
    assert result.after.per_node == 95
    daemon = plan_pod(reshape(guaranteed_sandbox(), DEFAULT, daemonset=True), node)
    assert daemon.backing.off == "no swap-node placement: a DaemonSet's pod"
    critical = pod(container("app", request="2Gi", limit="2Gi"),
                   priorityClassName="system-node-critical")
    skipped = plan_pod(reshape(critical, DEFAULT), node)
    assert skipped.backing.off == "pod left unchanged: critical pod"
    assert skipped.backing.need == 0
    # Request 0 and a limit: Burstable, but the kubelet gives it no swap, nor does the
    # webhook place it (not changed, not swap-eligible).
    zero = plan_pod(reshape(pod(container("app", request="0", limit="1Gi")), DEFAULT), node)
    assert zero.backing.off == "no swap-node placement: no container gets swap"
    # Placed on swap nodes, but nothing changed: the webhook requires no backing for it.
    eligible = plan_pod(reshape(pod(container("app", request="100Mi", limit="1Gi")), DEFAULT), node)
    assert eligible.backing.off == "no container changed, nothing to back"
    assert eligible.backing.need == 0 and eligible.after.per_node == 110


# ------------------------------------------------------------------------------------ CLI

MANIFESTS = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: sandbox, namespace: agents}
spec:
  replicas: 100
  selector: {matchLabels: {app: sandbox}}
  template:
    metadata: {labels: {app: sandbox}}
    spec:
      containers:
        - name: app
          image: python
          resources:
            requests: {cpu: 100m, memory: 2Gi}
            limits: {cpu: 100m, memory: 2Gi}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: ignored}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: "@daily"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: job
              image: python
              resources:
                requests: {memory: 100Mi, cpu: 100m}
                limits: {memory: 2Gi}
"""

NODE_28 = ["--node-memory", "28Gi", "--node-swap", "56Gi", "--node-cpu", "8"]


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "manifests.yaml"
    path.write_text(MANIFESTS)
    return path


def test_cli_json_has_the_hand_computed_numbers(
    manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(manifests), *NODE_28, "-o", "json"]) == 0
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["node"] == {"memory": 28 * GI, "allocatableMemory": 28 * GI,
                                "swap": 56 * GI, "cpu": 8.0, "maxPods": 110, "swapRatio": 2.0,
                                "swapPermille": 2000}
    sandbox, nightly = document["workloads"]  # the ConfigMap is not a workload
    assert (sandbox["kind"], sandbox["name"], sandbox["namespace"]) == (
        "Deployment", "sandbox", "agents")
    (app,) = sandbox["containers"]
    assert app["before"] == {"request": 2 * GI, "limit": 2 * GI}
    assert app["after"] == {"request": 683 * MI, "limit": 2 * GI}
    assert (app["swapShare"], app["coldMemory"], app["fits"]) == (1366 * MI, 1365 * MI, True)
    assert sandbox["before"]["byMemory"] == 14 and sandbox["after"]["byMemory"] == 41
    assert sandbox["after"]["byCpu"] == 80 and sandbox["after"]["binds"] == ["memory"]
    assert (sandbox["before"]["nodesNeeded"], sandbox["after"]["nodesNeeded"]) == (8, 3)
    assert sandbox["swapRatio"] == {"node": 2.0, "needed": 1365 / 683, "fits": True}
    # need ceil(1000 * 1365Mi / 683Mi) = ceil(1998.5) = 1999 <= 2000: backed.
    assert sandbox["backing"] == {"need": 1999, "nodePermille": 2000, "backed": True,
                                  "applies": True, "off": None}
    # The CronJob's container is already request < limit: swapwise changes nothing, so its
    # placement requires no backing (its cold memory not fitting is the FITS column's).
    assert nightly["backing"] == {"need": 0, "nodePermille": 2000, "backed": True,
                                  "applies": False,
                                  "off": "no container changed, nothing to back"}
    # CronJob template: 100Mi/2Gi on swap/RAM 2: share 200Mi, cold 1948Mi, needs 683Mi.
    (job,) = nightly["containers"]
    assert (job["swapShare"], job["fits"], job["fitRequest"]) == (200 * MI, False, 683 * MI)
    assert nightly["replicas"] is None and nightly["after"]["nodesNeeded"] is None
    assert nightly["after"]["binds"] == ["cpu"]  # 80 by CPU < 110 pods < 286 by memory
    assert "app memory request 2Gi -> 683Mi (limit 2Gi)" in err


def test_cli_table_is_aligned_and_readable(
    manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(manifests), *NODE_28]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == ("node: memory 28Gi (schedulable 28Gi), swap 56Gi, cpu 8, max pods 110; "
                        "swap/RAM 2; swapwise.io/swap-permille 2000")
    header = next(line for line in lines if line.lstrip().startswith("CONTAINER"))
    row = lines[lines.index(header) + 1]
    # Columns line up: each value starts where its header starts.
    for column, value in (("MEMORY REQUEST", "2Gi -> 683Mi"), ("SWAP SHARE", "1366Mi"),
                          ("COLD", "1365Mi"), ("FITS", "yes")):
        assert row.index(value) == header.index(column)
    density = next(line for line in lines if line.lstrip().startswith("PODS/NODE"))
    after = next(line for line in lines if line.lstrip().startswith("after"))
    assert after.split() == ["after", "683Mi", "100m", "41", "80", "110", "41", "memory", "3"]
    assert after.index("41") == density.index("BY MEMORY")
    assert "no (needs request >= 683Mi)" in out
    assert "swapRatio: node 2, needed 1.999: cold memory fits in swap" in out
    assert "  backing: pod needs swapwise.io/swap-permille >= 1999, node has 2000: backed\n" in out


def test_cli_profile_and_policy_are_honoured(
    tmp_path: Path, manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
        "profiles": {"dense": {"swapRatio": 3}, "other": {}},
    }))
    args = ["plan", "-f", str(manifests), *NODE_28, "--policy", str(policy),
            "--profile", "dense", "-o", "json"]
    assert main(args) == 0
    sandbox = json.loads(capsys.readouterr().out)["workloads"][0]
    # swapRatio 3 -> request = ceilMi(2048Mi / 4) = 512Mi; 28672 // 512 = 56 pods.
    assert sandbox["profile"] == "dense"
    assert sandbox["containers"][0]["after"]["request"] == 512 * MI
    assert sandbox["after"]["byMemory"] == 56


def test_cli_says_when_the_node_does_not_back_the_pods(
    manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = ["--node-memory", "64Gi", "--node-swap", "1Gi", "--node-cpu", "16"]
    assert main(["plan", "-f", str(manifests), *small, "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["node"]["swapPermille"] == 15
    sandbox = document["workloads"][0]
    assert sandbox["backing"] == {"need": 1999, "nodePermille": 15, "backed": False,
                                  "applies": True, "off": None}
    assert sandbox["after"]["byMemory"] == 95
    assert (sandbox["after"]["perNode"], sandbox["after"]["binds"]) == (0, ["backing"])
    assert sandbox["after"]["nodesNeeded"] is None  # no node of this shape takes one
    assert sandbox["before"]["perNode"] == 32

    assert main(["plan", "-f", str(manifests), *small]) == 0
    out = capsys.readouterr().out
    after = next(line for line in out.splitlines() if line.lstrip().startswith("after"))
    assert after.split() == ["after", "683Mi", "100m", "95", "160", "110", "0", "backing", "-"]
    assert ("backing: pod needs swapwise.io/swap-permille >= 1999, node has 15: NOT backed: "
            "placement requires backing, so the scheduler puts none of these pods on such a "
            "node (fits 0)") in out


def test_cli_says_when_backing_is_off(
    tmp_path: Path, manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
        "profiles": {"soft": {"placement": {"mode": "preferred"}}},
    }))
    args = ["plan", "-f", str(manifests), "--node-memory", "64Gi", "--node-swap", "1Gi",
            "--node-cpu", "16", "--policy", str(policy)]
    assert main([*args, "-o", "json"]) == 0
    sandbox = json.loads(capsys.readouterr().out)["workloads"][0]
    assert sandbox["backing"] == {"need": 1999, "nodePermille": 15, "backed": False,
                                  "applies": False, "off": "placement.mode: preferred"}
    assert sandbox["after"]["perNode"] == 95
    assert main(args) == 0
    assert ("backing: off (placement.mode: preferred): pod needs swapwise.io/swap-permille "
            ">= 1999, node has 15: would NOT be backed, not enforced by the scheduler") in \
        capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["--node-memory", "30Q", "--node-swap", "1Gi", "--node-cpu", "8"], "--node-memory"),
    (["--node-memory", "0", "--node-swap", "1Gi", "--node-cpu", "8"], "node memory"),
    (["--node-memory", "8Gi", "--node-swap=-1Gi", "--node-cpu", "8"], "node swap"),
    (["--node-memory", "8Gi", "--node-swap", "1Gi", "--node-cpu", "eight"], "--node-cpu"),
    ([*NODE_28, "--allocatable-memory", "64Gi"], "allocatable"),
    ([*NODE_28, "--profile", "nope"], "unknown profile 'nope'"),
    ([*NODE_28, "--policy", "/nonexistent/policy.yaml"], "policy"),
])
def test_cli_bad_input_exits_1_with_a_message(
    manifests: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["plan", "-f", str(manifests), *args]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("swapwise: ") and message in err


@pytest.mark.parametrize(("text", "message"), [
    ("kind: ConfigMap\nmetadata: {name: x}\n", "no Pod, Deployment"),
    ("a: [unclosed\n", "not valid YAML"),
    (yaml.safe_dump(pod(container("app", request="lots"))), "Pod/p: "),
])
def test_cli_unusable_manifests_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    assert main(["plan", "-f", str(path), *NODE_28]) == 1
    assert message in capsys.readouterr().err


def test_cli_missing_file_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "-f", "/nonexistent.yaml", *NODE_28]) == 1
    assert "cannot read /nonexistent.yaml" in capsys.readouterr().err
