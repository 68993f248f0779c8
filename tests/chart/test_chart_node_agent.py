"""The node agent (`swapwise node-agent`): a DaemonSet on by default, its least-privilege RBAC,
and the ValidatingAdmissionPolicy that keeps its token to its own Node and swapwise.io/ keys.

The container's arguments are read back with the agent's own parser; what the admission
policy does on a real API server is proven in tests/e2e/test_node_agent_privilege.py.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from chartlib import CHART, NAMESPACE, Chart, Obj, all_of, kinds, one

from webhook.agent.stall import CPU_DEFAULTS, MEMORY_DEFAULTS, Thresholds
from webhook.cli import build_parser
from webhook.engine.pressure import MARKS

NAME = "sw-swapwise-node-agent"
USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
NODE_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
CONFIGZ_RULE = {"apiGroups": [""], "resources": ["nodes/configz"], "verbs": ["get"]}
AGENT_KINDS = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "ServiceAccount",
               "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
VALIDATE_VERSION = "1.34.0"


def agent_objects(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["metadata"]["labels"].get("app.kubernetes.io/component")
            == "node-agent"]


def pod_spec(objs: list[Obj]) -> Obj:
    return dict(one(objs, "DaemonSet", NAME)["spec"]["template"]["spec"])


def agent_container(objs: list[Obj]) -> Obj:
    [c] = pod_spec(objs)["containers"]
    return dict(c)


def parsed(objs: list[Obj]) -> argparse.Namespace:
    """The container's command line as `swapwise node-agent` reads it."""
    c = agent_container(objs)
    assert c["command"] == ["swapwise", "node-agent"]
    return build_parser("node-agent").parse_args(["node-agent", *c["args"]])


def rules(objs: list[Obj]) -> list[Obj]:
    return list(one(objs, "ClusterRole", NAME)["rules"])


# ---- on by default, what it renders ----------------------------------------------------


def test_on_by_default_every_object_valid(chart: Chart) -> None:
    objs = chart.render()
    agent = agent_objects(objs)
    assert sorted(kinds(agent)) == AGENT_KINDS
    assert {o["metadata"]["name"] for o in agent} == {NAME}
    for obj in agent:
        kubernetes_validate.validate(obj, VALIDATE_VERSION, strict=True)


def test_one_value_turns_it_off(chart: Chart) -> None:
    objs = chart.render({"nodeAgent": {"enabled": False}})
    assert agent_objects(objs) == []
    assert not [o for o in objs if "node-agent" in o["metadata"]["name"]]
    assert sorted(kinds(chart.render())) == sorted(kinds(objs) + AGENT_KINDS)


def test_renders_in_mode_admission_policy_too(chart: Chart) -> None:
    objs = chart.render({"mode": "admissionPolicy", "admissionPolicy": {"objects": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": "swapwise-x"}, "spec": {}}]}})
    assert sorted(kinds(agent_objects(objs))) == AGENT_KINDS


# ---- the command line -------------------------------------------------------------------


def test_default_arguments_are_the_agents_own_defaults(chart: Chart) -> None:
    """values.yaml spells the agent's defaults out (users see them in `helm show values`);
    they must be the ones webhook/agent writes, or the chart would quietly differ."""
    args = parsed(chart.render())
    defaults = build_parser("node-agent").parse_args(["node-agent"])
    for field in ("swap_behavior_source", "zram_backing", "pressure_marks", "memory_marks",
                  "cpu_marks", "mark_with",
                  "memory_mark_above", "memory_clear_below", "cpu_mark_above",
                  "cpu_clear_below", "mark_window", "clear_window", "resync", "metrics_port",
                  "log_level", "kubelet_insecure_tls", "kubelet_ca", "host_proc", "host_sys",
                  "kubepods_cgroup"):
        assert getattr(args, field) == getattr(defaults, field), field
    assert (args.memory_mark_above, args.memory_clear_below) == (
        MEMORY_DEFAULTS.mark_above, MEMORY_DEFAULTS.clear_below)
    assert (args.cpu_mark_above, args.cpu_clear_below) == (
        CPU_DEFAULTS.mark_above, CPU_DEFAULTS.clear_below)
    # Only the cgroup tree is the host's (mounted); /proc and /sys are the container's own.
    assert args.host_cgroup == "/host/sys/fs/cgroup"
    assert "--node-name" not in agent_container(chart.render())["args"]  # $NODE_NAME


def test_every_value_becomes_the_flag_the_agent_reads(chart: Chart) -> None:
    objs = chart.render({"nodeAgent": {
        "swapBehaviorSource": "kubelet", "kubelet": {"insecureTLS": True}, "zramBacking": 0.25,
        "pressureMarks": {"enabled": False, "markWith": "taint",
                          "memory": {"markAbove": 35, "clearBelow": 7.5},
                          "cpu": {"enabled": False, "markAbove": 90, "clearBelow": 90},
                          "markWindow": 6, "clearWindow": 600},
        "resync": 600, "logLevel": "debug", "metricsPort": 9100,
        "extraArgs": ["--kubepods-cgroup", "kubepods"]}})
    args = parsed(objs)
    assert args.swap_behavior_source == "kubelet"
    assert args.kubelet_insecure_tls is True
    assert args.zram_backing == 0.25
    assert args.pressure_marks is False
    assert (args.memory_marks, args.cpu_marks) == (True, False)
    assert args.mark_with == "taint"
    assert (args.memory_mark_above, args.memory_clear_below) == (35, 7.5)
    assert (args.cpu_mark_above, args.cpu_clear_below) == (90, 90)
    assert (args.mark_window, args.clear_window, args.resync) == (6, 600, 600)
    assert (args.log_level, args.metrics_port, args.kubepods_cgroup) == ("debug", 9100, "kubepods")
    # What run() then builds from them: the agent's own checks accept them.
    Thresholds(args.memory_mark_above, args.memory_clear_below, args.mark_window,
               args.clear_window)
    c = agent_container(objs)
    assert c["ports"] == [{"name": "metrics", "containerPort": 9100, "protocol": "TCP"}]


@pytest.mark.parametrize("zram", [0, 1, 0.5, 0.001])
def test_zram_backing_reaches_the_agent_exactly(chart: Chart, zram: float) -> None:
    assert parsed(chart.render({"nodeAgent": {"zramBacking": zram}})).zram_backing == \
        pytest.approx(zram)


def test_node_name_comes_from_the_downward_api(chart: Chart) -> None:
    c = agent_container(chart.render())
    assert c["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {
        "fieldPath": "spec.nodeName"}}}]


def test_kubelet_tls_flags_only_with_the_kubelet_source(chart: Chart) -> None:
    ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    objs = chart.render({"nodeAgent": {"swapBehaviorSource": "kubelet",
                                       "kubelet": {"caBundle": ca}}})
    args = parsed(objs)
    assert args.kubelet_ca == "/etc/swapwise/kubelet-ca/ca.crt"
    assert args.kubelet_insecure_tls is False
    cm = one(objs, "ConfigMap", f"{NAME}-kubelet-ca")
    assert cm["data"] == {"ca.crt": ca}
    kubernetes_validate.validate(cm, VALIDATE_VERSION, strict=True)
    mounts = {m["name"]: m for m in agent_container(objs)["volumeMounts"]}
    assert mounts["kubelet-ca"] == {"name": "kubelet-ca", "mountPath": "/etc/swapwise/kubelet-ca",
                                    "readOnly": True}
    # Declared: the kubelet is never called, so no flag, no ConfigMap.
    objs = chart.render({"nodeAgent": {"kubelet": {"caBundle": ca, "insecureTLS": False}}})
    assert parsed(objs).kubelet_ca is None
    assert f"{NAME}-kubelet-ca" not in {o["metadata"]["name"] for o in objs}
    err = chart.error({"nodeAgent": {"swapBehaviorSource": "kubelet",
                                     "kubelet": {"caBundle": ca, "insecureTLS": True}}})
    assert "nodeAgent.kubelet: give caBundle or insecureTLS, not both" in err


# ---- the pod ----------------------------------------------------------------------------


def test_pod_is_restricted_but_for_one_read_only_host_mount(chart: Chart) -> None:
    objs = chart.render()
    spec = pod_spec(objs)
    c = agent_container(objs)
    assert spec["hostNetwork"] is False
    assert not {"hostPID", "hostIPC"} & set(spec)
    assert spec["serviceAccountName"] == NAME
    assert spec["automountServiceAccountToken"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 65532
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in sc and "add" not in sc["capabilities"]
    # One host path, the cgroup2 tree, read-only; not the host's /proc (not needed: /proc/swaps
    # and /proc/pressure are not namespaced, and a read-only mount would refuse PSI triggers).
    assert spec["volumes"] == [{"name": "host-cgroup", "hostPath": {
        "path": "/sys/fs/cgroup", "type": "Directory"}}]
    assert c["volumeMounts"] == [{"name": "host-cgroup", "mountPath": "/host/sys/fs/cgroup",
                                  "readOnly": True}]


def test_without_kubepods_pressure_no_host_mount_at_all(chart: Chart) -> None:
    """What a namespace enforcing PodSecurity restricted admits."""
    objs = chart.render({"nodeAgent": {"kubepodsPressure": False}})
    spec = pod_spec(objs)
    assert "volumes" not in spec and "volumeMounts" not in agent_container(objs)
    assert parsed(objs).host_cgroup == "/sys/fs/cgroup"  # the agent's default: its own view


def test_probes_resources_priority_and_rollout(chart: Chart) -> None:
    objs = chart.render()
    c = agent_container(objs)
    assert c["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"),
                        ("readinessProbe", "/readyz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "metrics"}, probe
    assert c["resources"] == {"requests": {"cpu": "5m", "memory": "48Mi"},
                              "limits": {"memory": "64Mi"}}
    spec = pod_spec(objs)
    assert spec["priorityClassName"] == "system-node-critical"
    ds = one(objs, "DaemonSet", NAME)
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": "10%"}}
    assert "priorityClassName" not in pod_spec(chart.render({"nodeAgent": {
        "priorityClassName": ""}}))


def test_image_is_the_webhooks_unless_given(chart: Chart) -> None:
    assert agent_container(chart.render({"image": {"repository": "r/sw", "tag": "1.2"}}))[
        "image"] == "r/sw:1.2"
    assert agent_container(chart.render({"nodeAgent": {"image": {
        "repository": "r/agent", "digest": "sha256:" + "a" * 64}}}))["image"] == \
        "r/agent@sha256:" + "a" * 64


def test_every_linux_node_and_every_taint_by_default(chart: Chart) -> None:
    spec = pod_spec(chart.render())
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"] == [{"operator": "Exists"}]
    assert "affinity" not in spec


def test_chosen_nodes_stay_linux_and_keep_the_agents_own_taints(chart: Chart) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In",
                                                     "values": ["swap"]}]}]}}}
    spec = pod_spec(chart.render({"nodeAgent": {
        "nodeSelector": {"pool": "swap", "kubernetes.io/os": "windows"}, "affinity": affinity,
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "x",
                         "effect": "NoSchedule"}]}}))
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "pool": "swap"}
    assert spec["affinity"] == affinity
    # A node its agent tainted must take the next agent pod, or no one clears the mark.
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
        *({"key": mark.key, "operator": "Exists", "effect": "NoSchedule"} for mark in MARKS)]
    assert pod_spec(chart.render({"nodeAgent": {"tolerations": []}}))["tolerations"] == [
        {"key": mark.key, "operator": "Exists", "effect": "NoSchedule"} for mark in MARKS]


# ---- RBAC: least privilege --------------------------------------------------------------


@pytest.mark.parametrize(("source", "expected"), [("declared", [NODE_RULE]),
                                                  ("kubelet", [NODE_RULE, CONFIGZ_RULE])])
def test_rbac_is_nodes_and_configz_only_with_the_kubelet_source(
        chart: Chart, source: str, expected: list[Obj]) -> None:
    objs = chart.render({"nodeAgent": {"swapBehaviorSource": source}})
    assert rules(objs) == expected
    assert parsed(objs).swap_behavior_source == source
    binding = one(objs, "ClusterRoleBinding", NAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": NAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME,
                                    "namespace": NAMESPACE}]
    sa = one(objs, "ServiceAccount", NAME)
    assert sa["metadata"]["namespace"] == NAMESPACE
    assert sa["automountServiceAccountToken"] is True
    # Nothing else of the agent's is bound anywhere.
    assert [o for o in agent_objects(objs) if o["kind"] in ("Role", "RoleBinding")] == []


# Every switch of the chart that could add a permission, in every combination with the agent's
# own: whatever a user picks, nothing rendered names nodes/proxy.
MATRIX_AXES: list[list[dict[str, Any]]] = [
    [{}, {"nodeAgent": {"enabled": False}}],
    [{}, {"nodeAgent": {"swapBehaviorSource": "kubelet"}},
     {"nodeAgent": {"swapBehaviorSource": "kubelet", "kubelet": {"insecureTLS": True}}}],
    [{}, {"nodeAgent": {"pressureMarks": {"enabled": False}, "kubepodsPressure": False}},
     {"nodeAgent": {"pressureMarks": {"markWith": "taint"}, "priorityClassName": ""}}],
    [{}, {"audit": {"rbac": {"create": True}}}],
    [{}, {"webhook": {"url": "https://127.0.0.1:8443"}}, {"mode": "admissionPolicy"}],
]
MONITORING = {"metrics": {"prometheusRule": {"enabled": True},
                          "grafanaDashboard": {"enabled": True},
                          "serviceMonitor": {"enabled": True}}}
AP_OBJECTS = [{"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "ValidatingAdmissionPolicy", "metadata": {"name": "swapwise-x"},
               "spec": {}}]


def merge(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(
                out.get(key), dict) else value
    return out


def matrix() -> list[dict[str, Any]]:
    combos = []
    for parts in itertools.product(*MATRIX_AXES):
        values = merge(*parts)
        if values.get("mode") == "admissionPolicy":
            values["admissionPolicy"] = {"objects": AP_OBJECTS}
        if values.get("nodeAgent", {}).get("enabled") is False and len(values["nodeAgent"]) > 1:
            continue  # the agent's knobs do nothing while it is off
        combos.append(values)
    return combos


def assert_no_nodes_proxy(text: str, values: dict[str, Any]) -> None:
    assert "nodes/proxy" not in text, values
    objs = [o for o in yaml.safe_load_all(text) if o]
    for role in all_of(objs, "ClusterRole") + all_of(objs, "Role"):
        for rule in role["rules"]:
            # No wildcard can grant it either.
            assert "*" not in rule.get("resources", []) + rule.get("verbs", []), role
            assert not any("proxy" in r for r in rule.get("resources", [])), role


def test_nothing_rendered_ever_names_nodes_proxy(chart: Chart) -> None:
    combos = matrix()
    assert len(combos) >= 50
    for values in combos:
        assert_no_nodes_proxy(chart.template_text(values), values)


@pytest.mark.parametrize("mode", ["webhook", "admissionPolicy"])
def test_nothing_rendered_with_monitoring_names_nodes_proxy(chart: Chart, mode: str) -> None:
    values = merge(MONITORING, {"mode": mode, "audit": {"rbac": {"create": True}},
                                "nodeAgent": {"swapBehaviorSource": "kubelet"}})
    if mode == "admissionPolicy":
        values["admissionPolicy"] = {"objects": AP_OBJECTS}
    assert_no_nodes_proxy(chart.template_text(values), values)


# ---- the admission policy ---------------------------------------------------------------


def test_admission_policy_binds_the_agents_account_and_denies(chart: Chart) -> None:
    objs = chart.render()
    policy = one(objs, "ValidatingAdmissionPolicy", NAME)["spec"]
    binding = one(objs, "ValidatingAdmissionPolicyBinding", NAME)["spec"]
    assert binding == {"policyName": NAME, "validationActions": ["Deny"]}
    assert policy["failurePolicy"] == "Fail"
    assert policy["matchConstraints"] == {"resourceRules": [{
        "apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
        "resources": ["nodes", "nodes/status"]}]}
    sa = one(objs, "ServiceAccount", NAME)["metadata"]
    assert policy["matchConditions"] == [{
        "name": "node-agent",
        "expression": f'request.userInfo.username == "system:serviceaccount:'
                      f'{sa["namespace"]}:{sa["name"]}"'}]
    claim = 'request.userInfo.extra[\'authentication.kubernetes.io/node-name\']'
    variables = {v["name"]: " ".join(v["expression"].split()) for v in policy["variables"]}
    assert claim in variables["nodeClaim"]
    checks = [v["expression"] for v in policy["validations"]]
    assert checks[0] == ("size(variables.nodeClaim) == 1 && variables.nodeClaim[0] == "
                         "object.metadata.name")
    for name in ("foreignLabels", "foreignAnnotations", "foreignTaints", "evictingTaints",
                 "otherFields"):
        assert f"size(variables.{name}) == 0" in checks, name
    # Every field of NodeSpec but taints, and the metadata of the Node's lifecycle.
    for field in ("spec.unschedulable", "spec.podCIDR", "spec.podCIDRs", "spec.providerID",
                  "spec.externalID", "spec.configSource", "metadata.finalizers",
                  "metadata.ownerReferences"):
        assert f"['{field}']" in variables["otherFields"], field
    for v in policy["validations"]:
        assert v["reason"] == "Forbidden"
        assert "swapwise node agent: refused" in v["messageExpression"]


def test_admission_policy_follows_release_names(chart: Chart) -> None:
    objs = chart.render({"fullnameOverride": "sw-x"}, namespace="nodes-ns")
    policy = one(objs, "ValidatingAdmissionPolicy", "sw-x-node-agent")["spec"]
    assert policy["matchConditions"][0]["expression"] == (
        'request.userInfo.username == "system:serviceaccount:nodes-ns:sw-x-node-agent"')
    assert one(objs, "ValidatingAdmissionPolicyBinding", "sw-x-node-agent")["spec"][
        "policyName"] == "sw-x-node-agent"
    assert pod_spec_named(objs, "sw-x-node-agent")["serviceAccountName"] == "sw-x-node-agent"


def pod_spec_named(objs: list[Obj], name: str) -> Obj:
    return dict(one(objs, "DaemonSet", name)["spec"]["template"]["spec"])


def test_swapwise_prefix_is_the_keys_the_agent_writes() -> None:
    """The policy lets through exactly swapwise.io/ keys: every key webhook/agent writes is one."""
    from webhook.engine import nodes
    from webhook.engine.backing import PERMILLE_LABEL
    template = (CHART / "templates" / "node-agent.yaml").read_text()
    assert set(re.findall(r"startsWith\('([^']+)'\)", template)) == {"swapwise.io/"}
    for key in (nodes.SWAP_NODE_LABEL, nodes.KIND_LABEL, nodes.FACTS_ANNOTATION,
                nodes.SWAP_NODE_ANNOTATION, PERMILLE_LABEL, *(m.key for m in MARKS)):
        assert key.startswith("swapwise.io/"), key


# ---- values the schema or the chart refuse ----------------------------------------------


@pytest.mark.parametrize(("values", "said"), [
    ({"pressureMarks": {"memory": {"markAbove": 0, "clearBelow": 0}}},
     "/nodeAgent/pressureMarks/memory"),
    ({"pressureMarks": {"cpu": {"markAbove": 101}}}, "/nodeAgent/pressureMarks/cpu/markAbove"),
    ({"pressureMarks": {"cpu": {"clearBelow": "10"}}}, "/nodeAgent/pressureMarks/cpu/clearBelow"),
    ({"pressureMarks": {"markWindow": 0.5}}, "/nodeAgent/pressureMarks/markWindow"),
    ({"pressureMarks": {"clearWindow": 3601}}, "/nodeAgent/pressureMarks/clearWindow"),
    ({"pressureMarks": {"markWith": "annotation"}}, "/nodeAgent/pressureMarks/markWith"),
    ({"pressureMarks": {"windows": 3}}, "/nodeAgent/pressureMarks"),
    ({"resync": 59}, "/nodeAgent/resync"),
    ({"resync": 86401}, "/nodeAgent/resync"),
    ({"zramBacking": 1.5}, "/nodeAgent/zramBacking"),
    ({"zramBacking": -0.1}, "/nodeAgent/zramBacking"),
    ({"swapBehaviorSource": "Kubelet"}, "/nodeAgent/swapBehaviorSource"),
    ({"logLevel": "trace"}, "/nodeAgent/logLevel"),
    ({"metricsPort": 0}, "/nodeAgent/metricsPort"),
    ({"enabled": "yes"}, "/nodeAgent/enabled"),
    ({"tolerations": [{"operator": "Sometimes"}]}, "/nodeAgent/tolerations/0/operator"),
    ({"label": "x=y"}, "/nodeAgent"),
])
def test_bad_values_are_refused_with_their_path(chart: Chart, values: dict[str, Any],
                                                said: str) -> None:
    assert said in chart.error({"nodeAgent": values})


@pytest.mark.parametrize(("values", "message", "thresholds"), [
    ({"memory": {"markAbove": 30, "clearBelow": 31}},
     "nodeAgent.pressureMarks.memory: clearBelow (31) must not be above markAbove (30)",
     (30, 31, 10, 60)),
    ({"cpu": {"markAbove": 50, "clearBelow": 50.5}},
     "nodeAgent.pressureMarks.cpu: clearBelow (50.5) must not be above markAbove (50)",
     (50, 50.5, 10, 60)),
    ({"markWindow": 120, "clearWindow": 60},
     "nodeAgent.pressureMarks: markWindow (120) must not be above clearWindow (60)",
     (60, 10, 120, 60)),
])
def test_what_the_agent_would_refuse_is_refused_at_install(
        chart: Chart, values: dict[str, Any], message: str,
        thresholds: tuple[float, float, float, float]) -> None:
    assert message in chart.error({"nodeAgent": {"pressureMarks": values}})
    with pytest.raises(ValueError):  # the agent's own rule, which the chart states early
        Thresholds(*thresholds)


def test_the_labeller_values_are_refused_pointing_to_the_node_agent(chart: Chart) -> None:
    err = chart.error({"labeller": {"enabled": True}})
    assert "at '/labeller'" in err
    assert "nodeAgent" in err and "replaces swapwise label-nodes" in err


def test_values_yaml_documents_the_defaults_it_sets() -> None:
    """Each threshold default sits in values.yaml once, with the CLI's value."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())["nodeAgent"]
    marks = values["pressureMarks"]
    assert (marks["memory"]["markAbove"], marks["memory"]["clearBelow"]) == (
        MEMORY_DEFAULTS.mark_above, MEMORY_DEFAULTS.clear_below)
    assert (marks["cpu"]["markAbove"], marks["cpu"]["clearBelow"]) == (
        CPU_DEFAULTS.mark_above, CPU_DEFAULTS.clear_below)
    assert (marks["markWindow"], marks["clearWindow"]) == (
        MEMORY_DEFAULTS.mark_window, MEMORY_DEFAULTS.clear_window)
    assert values["enabled"] is True
    assert json.dumps(values).count("nodes/proxy") == 0
