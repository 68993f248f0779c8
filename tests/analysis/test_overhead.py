"""Pod overhead (RuntimeClass ``overhead.podFixed`` / ``spec.overhead``) in ``swapwise plan``.

Mi = 1048576 bytes. Each expected value is worked out by hand in the comment above it. The
scheduler adds the overhead to the pod's requests; no container's swap share covers it, so it
changes pods per node and nothing in the swap columns.
"""

from __future__ import annotations

import copy
import json
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.engine_check import apply
from webhook.analysis.overhead import (
    NO_OVERHEAD,
    Overhead,
    OverheadError,
    RuntimeClass,
    collect_runtime_classes,
    parse_runtime_class,
    pod_overhead,
)
from webhook.analysis.planner import Node, plan_pod
from webhook.cli import main
from webhook.engine import mutate_pod, reshape
from webhook.policy import default_policy

MI = 1024**2
GI = 1024**3
DEFAULT = default_policy().profiles["default"]  # swapRatio 2 -> requestRatio 1/3
NODE_28 = Node(memory=28 * GI, swap=56 * GI, cpu=Fraction(8))


def runtime_class(name: str, **pod_fixed: str) -> dict[str, Any]:
    document: dict[str, Any] = {
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
        "handler": "runsc",
    }
    if pod_fixed:
        document["overhead"] = {"podFixed": pod_fixed}
    return document


GVISOR = runtime_class("gvisor", memory="250Mi")  # gVisor-like: the Sentry's own memory
KATA = runtime_class("kata-fc", memory="120Mi", cpu="250m")  # the Kubernetes docs' example


def sandbox(**spec: Any) -> dict[str, Any]:
    """The 2Gi / 100m Guaranteed sandbox pod."""
    app = {"name": "app", "image": "python", "resources": {
        "requests": {"cpu": "100m", "memory": "2Gi"}, "limits": {"cpu": "100m", "memory": "2Gi"},
    }}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sandbox"},
            "spec": {"containers": [app], **spec}}


def classes(*documents: dict[str, Any]) -> dict[str, RuntimeClass]:
    return collect_runtime_classes(documents)


# ------------------------------------------------------------------------ hand-computed


def test_2gi_sandbox_with_250mi_gvisor_overhead_on_28gi_node() -> None:
    result = plan_pod(reshape(sandbox(runtimeClassName="gvisor"), DEFAULT),
                      NODE_28, runtime_classes=classes(GVISOR))
    assert result.overhead == Overhead(memory=250 * MI, cpu=Fraction(0),
                                       source="RuntimeClass/gvisor")
    # before: 2048 + 250 = 2298Mi a pod; 28672 // 2298 = 12 (12.48), not 14 without overhead.
    assert result.before.memory_request == 2298 * MI
    assert result.before.overhead_memory == 250 * MI
    assert result.before.by_memory == 12
    # after: 683 + 250 = 933Mi; 28672 // 933 = 30 (30.73), not 41: 2.5x instead of 2.93x.
    assert result.after.memory_request == 933 * MI
    assert result.after.by_memory == 30
    assert (result.before.per_node, result.after.per_node) == (12, 30)
    assert result.before.binds == result.after.binds == ("memory",)
    # CPU: the overhead declares none, 8 / 0.1 = 80 either way.
    assert result.after.by_cpu == 80
    # 100 replicas: ceil(100 / 12) = 9 nodes before, ceil(100 / 30) = 4 after.
    assert (result.before.nodes_for(100), result.after.nodes_for(100)) == (9, 4)
    # The container's swap share is untouched by the overhead: 683Mi * 2 = 1366Mi >= 1365Mi.
    (app,) = result.containers
    assert (app.request_after, app.swap_share, app.cold, app.fits) == (
        683 * MI, 1366 * MI, 1365 * MI, True)
    assert result.warnings == ("swapwise: app memory request 2Gi -> 683Mi (limit 2Gi)",
                               "swapwise: needs nodes whose swap is >= 1999\u2030 of their RAM "
                               "(node label swapwise.io/swap-permille, from the node agent)")


def test_kata_like_cpu_overhead_makes_cpu_bind_first() -> None:
    result = plan_pod(reshape(sandbox(runtimeClassName="kata-fc"), DEFAULT),
                      NODE_28, runtime_classes=classes(KATA))
    # memory before: 2048 + 120 = 2168Mi; 28672 // 2168 = 13 (13.2).
    # cpu: 100m + 250m = 350m; 8 / 0.35 = 22 (22.86), before and after.
    assert (result.before.by_memory, result.before.by_cpu) == (13, 22)
    assert result.before.binds == ("memory",)
    # memory after: 683 + 120 = 803Mi; 28672 // 803 = 35 (35.7) > 22: CPU now binds.
    assert (result.after.by_memory, result.after.by_cpu) == (35, 22)
    assert result.after.per_node == 22
    assert result.after.binds == ("cpu",)
    assert result.after.cpu_request == Fraction(35, 100)
    assert result.after.overhead_cpu == Fraction(1, 4)


def test_spec_overhead_of_a_pod_read_back_from_a_cluster() -> None:
    # A pod as stored: the admission plugin wrote spec.overhead; its RuntimeClass is not given.
    stored = sandbox(runtimeClassName="gvisor", overhead={"memory": "250Mi"})
    result = plan_pod(reshape(stored, DEFAULT), NODE_28)
    assert result.overhead == Overhead(memory=250 * MI, source="spec.overhead")
    assert (result.before.by_memory, result.after.by_memory) == (12, 30)


def test_spec_overhead_matching_its_runtime_class_is_counted_once() -> None:
    stored = sandbox(runtimeClassName="gvisor", overhead={"memory": "262144000"})  # 250Mi
    result = plan_pod(reshape(stored, DEFAULT), NODE_28, runtime_classes=classes(GVISOR))
    assert result.overhead.source == "RuntimeClass/gvisor"
    assert result.after.memory_request == 933 * MI


def test_pod_level_request_plus_overhead() -> None:
    # The scheduler takes the pod-level request instead of the containers', then adds overhead.
    pod = sandbox(runtimeClassName="gvisor", resources={"requests": {"memory": "3Gi"}})
    result = plan_pod(reshape(pod, DEFAULT), NODE_28, runtime_classes=classes(GVISOR))
    # 3072 + 250 = 3322Mi; 28672 // 3322 = 8 (8.63).
    assert result.after.memory_request == 3322 * MI
    assert result.after.by_memory == 8


def test_runtime_class_without_overhead_adds_nothing() -> None:
    result = plan_pod(reshape(sandbox(runtimeClassName="runc"), DEFAULT),
                      NODE_28, runtime_classes=classes(runtime_class("runc")))
    assert result.overhead == Overhead(source="RuntimeClass/runc")
    assert not result.overhead
    assert (result.before.by_memory, result.after.by_memory) == (14, 41)


def test_unknown_runtime_class_warns_and_plans_without_overhead() -> None:
    result = plan_pod(reshape(sandbox(runtimeClassName="gvisor"), DEFAULT), NODE_28)
    assert result.overhead == NO_OVERHEAD
    assert result.after.by_memory == 41
    assert ("RuntimeClass 'gvisor' is not in the input or --runtime-class-file: planned "
            "without its pod overhead") in result.warnings


@pytest.mark.parametrize(("spec", "known", "message"), [
    ({"runtimeClassName": "gvisor", "overhead": {"memory": "200Mi"}}, [GVISOR],
     "spec.overhead differs from RuntimeClass/gvisor's overhead.podFixed"),
    ({"runtimeClassName": "gvisor", "overhead": {"memory": "250Mi", "cpu": "10m"}}, [GVISOR],
     "differs"),
    ({"runtimeClassName": "runc", "overhead": {"memory": "250Mi"}}, [runtime_class("runc")],
     "RuntimeClass/runc declares no overhead"),
    ({"overhead": {"memory": "250Mi"}}, [], "without a runtimeClassName"),
    ({"runtimeClassName": "gvisor", "overhead": {"memory": "lots"}}, [], "spec.overhead.memory"),
    ({"runtimeClassName": 7}, [], "runtimeClassName must be a non-empty string"),
])
def test_overhead_the_api_server_rejects_is_an_error(
    spec: dict[str, Any], known: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(OverheadError, match=message):
        pod_overhead(spec, classes(*known))


@pytest.mark.parametrize(("document", "message"), [
    ({"kind": "RuntimeClass", "handler": "runsc"}, "without metadata.name"),
    ({**GVISOR, "overhead": {"podFixed": {"memory": "-1Mi"}}}, "must not be negative"),
    ({**GVISOR, "overhead": {"podFixed": {"memory": "2 Gi"}}}, "podFixed.memory"),
    ({**GVISOR, "overhead": {"podFixed": ["250Mi"]}}, "podFixed must be a mapping"),
    ({**GVISOR, "overhead": "250Mi"}, "overhead must be a mapping"),
    ({**GVISOR, "spec": {"overhead": {}}}, "v1alpha1"),
])
def test_bad_runtime_class_is_an_error(document: dict[str, Any], message: str) -> None:
    with pytest.raises(OverheadError, match=message):
        parse_runtime_class(document)


def test_one_runtime_class_defined_twice_differently_is_an_error() -> None:
    assert classes(GVISOR, copy.deepcopy(GVISOR)) == {"gvisor": parse_runtime_class(GVISOR)}
    with pytest.raises(OverheadError, match="defined twice"):
        classes(GVISOR, runtime_class("gvisor", memory="300Mi"))


# ------------------------------------------------------------------------------- webhook


def test_webhook_reshapes_a_pod_with_overhead_like_any_other() -> None:
    """spec.overhead is not a container: the patch is the one of the same pod without it."""
    with_overhead = sandbox(runtimeClassName="gvisor",
                            overhead={"memory": "250Mi", "cpu": "50m"})
    result, mutation = apply(with_overhead, DEFAULT)  # nothing but memory/placement changes
    without = mutate_pod(sandbox(runtimeClassName="gvisor"), DEFAULT)
    assert mutation.patch == without.patch
    assert result["spec"]["overhead"] == {"memory": "250Mi", "cpu": "50m"}
    assert result["spec"]["containers"][0]["resources"]["requests"]["memory"] == "683Mi"


# ----------------------------------------------------------------------------------- CLI

NODE_ARGS = ["--node-memory", "28Gi", "--node-swap", "56Gi", "--node-cpu", "8"]


def deployment(runtime_class_name: str) -> dict[str, Any]:
    template = sandbox(runtimeClassName=runtime_class_name)
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "browsers", "namespace": "agents"},
            "spec": {"replicas": 100, "selector": {"matchLabels": {"app": "b"}},
                     "template": {"metadata": {"labels": {"app": "b"}}, "spec": template["spec"]}}}


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "manifests.yaml"
    path.write_text(yaml.safe_dump_all([GVISOR, deployment("gvisor")]))
    return path


def test_cli_json_reports_overhead_per_pod_and_in_the_totals(
    manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(manifests), *NODE_ARGS, "-o", "json"]) == 0
    (browsers,) = json.loads(capsys.readouterr().out)["workloads"]  # RuntimeClass: no workload
    assert browsers["overhead"] == {"memory": 250 * MI, "cpu": 0.0,
                                    "source": "RuntimeClass/gvisor"}
    assert browsers["before"]["memoryRequest"] == 2298 * MI
    assert browsers["after"]["memoryRequest"] == 933 * MI
    assert browsers["after"]["overheadMemory"] == 250 * MI
    assert (browsers["before"]["perNode"], browsers["after"]["perNode"]) == (12, 30)
    assert (browsers["before"]["nodesNeeded"], browsers["after"]["nodesNeeded"]) == (9, 4)


def test_cli_table_shows_the_overhead_line_and_totals(
    manifests: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "-f", str(manifests), *NODE_ARGS]) == 0
    out = capsys.readouterr().out
    assert ("  pod overhead (RuntimeClass/gvisor): memory 250Mi, cpu 0; included in MEMORY and "
            "CPU below, covered by no container's swap share") in out.splitlines()
    before = next(line for line in out.splitlines() if line.lstrip().startswith("before"))
    after = next(line for line in out.splitlines() if line.lstrip().startswith("after"))
    assert before.split() == ["before", "2298Mi", "100m", "12", "80", "110", "12", "memory", "9"]
    assert after.split() == ["after", "933Mi", "100m", "30", "80", "110", "30", "memory", "4"]


def test_cli_runtime_class_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "deployment.yaml"
    workload.write_text(yaml.safe_dump(deployment("kata-fc")))
    rc_file = tmp_path / "runtimeclasses.yaml"
    rc_file.write_text(yaml.safe_dump_all([GVISOR, KATA]))
    args = ["plan", "-f", str(workload), *NODE_ARGS, "-o", "json"]
    assert main([*args, "--runtime-class-file", str(rc_file)]) == 0
    (browsers,) = json.loads(capsys.readouterr().out)["workloads"]
    assert browsers["overhead"]["source"] == "RuntimeClass/kata-fc"
    assert (browsers["after"]["byMemory"], browsers["after"]["byCpu"]) == (35, 22)
    # Without the file: planned without overhead, and told so on stderr.
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["workloads"][0]["after"]["byMemory"] == 41
    assert ("Warning: Deployment/browsers: RuntimeClass 'kata-fc' is not in the input or "
            "--runtime-class-file") in err


@pytest.mark.parametrize(("rc_documents", "message"), [
    ([{"kind": "ConfigMap", "metadata": {"name": "x"}}], "ConfigMap is not a RuntimeClass"),
    ([], "no RuntimeClass in the file"),
    ([runtime_class("gvisor", memory="300Mi")], "RuntimeClass/gvisor is defined twice"),
    ([runtime_class("gvisor", memory="lots")], "RuntimeClass/gvisor: overhead.podFixed.memory"),
])
def test_cli_bad_runtime_classes_exit_1(
    manifests: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    rc_documents: list[dict[str, Any]], message: str,
) -> None:
    rc_file = tmp_path / "rc.yaml"
    rc_file.write_text(yaml.safe_dump_all(rc_documents))
    assert main(["plan", "-f", str(manifests), *NODE_ARGS,
                 "--runtime-class-file", str(rc_file)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("swapwise: ") and message in err


def test_cli_pod_the_api_server_would_reject_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump_all(
        [GVISOR, sandbox(runtimeClassName="gvisor", overhead={"memory": "1Gi"})]))
    assert main(["plan", "-f", str(path), *NODE_ARGS]) == 1
    assert "Pod/sandbox: spec.overhead differs from RuntimeClass/gvisor" in (
        capsys.readouterr().err)
