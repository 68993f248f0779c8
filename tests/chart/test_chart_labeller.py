"""The optional node labeller: off by default; minimal RBAC and a hardened pod when on.

The kubelet swapBehavior source and the pressure guard decide one permission: only they
may read nodes/proxy, which reaches every kubelet's whole API.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
from chartlib import CHART, REPO, Chart, Obj, all_of, kinds, one
from webhook.labeller import pressure

from webhook.cli import build_parser

NODE_RULE = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}
PROXY_RULE = {"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}
EVENTS_RULE = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
GUARD_FLAGS = ("--pressure-guard", "--pressure-interval", "--pressure-mark-above",
               "--pressure-clear-below", "--pressure-mark-after", "--pressure-clear-after")


def _flag(args: list[str], flag: str) -> str:
    """The value after ``flag``, which must appear exactly once."""
    assert args.count(flag) == 1, args
    return args[args.index(flag) + 1]


def _labeller(objs: list[Obj]) -> tuple[Obj, list[str]]:
    """The labeller's ClusterRole and its container's args."""
    deployment = next(o for o in all_of(objs, "Deployment") if o["metadata"]["name"].endswith(
        "-labeller"))
    [c] = deployment["spec"]["template"]["spec"]["containers"]
    return one(objs, "ClusterRole"), list(c["args"])


def test_off_by_default(chart: Chart) -> None:
    objs = chart.render()
    assert "ClusterRole" not in kinds(objs)
    assert all("labeller" not in o["metadata"]["name"] for o in objs)


def test_enabled_objects_rbac_and_pod(chart: Chart) -> None:
    objs = chart.render({"labeller": {"enabled": True, "label": "example.com/swap=yes"}})
    labeller = [o for o in objs if o["metadata"]["name"].endswith("-labeller")]
    assert sorted(kinds(labeller)) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment"]
    )
    [cluster_role] = all_of(objs, "ClusterRole")
    assert cluster_role["rules"] == [NODE_RULE]
    role = one(objs, "Role", "sw-swapwise-labeller")
    assert role["metadata"]["namespace"] == "swapwise-system"
    assert {r["resources"][0] for r in role["rules"]} == {"leases"}
    assert all(r["apiGroups"] == ["coordination.k8s.io"] for r in role["rules"])
    # Events about Nodes must be created in `default`: a Role of their own there, create only.
    events = one(objs, "Role", "sw-swapwise-labeller-events")
    assert events["metadata"]["namespace"] == "default"
    assert events["rules"] == [EVENTS_RULE]
    binding = one(objs, "RoleBinding", "sw-swapwise-labeller-events")
    assert binding["metadata"]["namespace"] == "default"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "sw-swapwise-labeller-events"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sw-swapwise-labeller",
                                    "namespace": "swapwise-system"}]
    deployment = next(o for o in all_of(objs, "Deployment") if o in labeller)
    pod = deployment["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert c["args"][0] == "label-nodes" or "label-nodes" in c.get("command", []) + c["args"]
    assert "example.com/swap=yes" in " ".join(c["args"])
    assert _flag(c["args"], "--swap-behavior-source") == "declared"  # the safe default
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert not set(GUARD_FLAGS) & set(c["args"])  # the guard is off by default
    for obj in [*labeller, events, binding]:
        kubernetes_validate.validate(obj, "1.34.0", strict=True)


@pytest.mark.parametrize("source", ["declared", "kubelet"])
def test_swap_behavior_source_sets_the_flag_and_only_kubelet_gets_nodes_proxy(
    chart: Chart, source: str
) -> None:
    objs = chart.render({"labeller": {"enabled": True, "swapBehaviorSource": source}})
    cluster_role, args = _labeller(objs)
    assert _flag(args, "--swap-behavior-source") == source
    # Patch stays in both: the label and the swapwise.io/swap-node annotation.
    expected = [NODE_RULE, PROXY_RULE] if source == "kubelet" else [NODE_RULE]
    assert cluster_role["rules"] == expected
    kubernetes_validate.validate(cluster_role, "1.34.0", strict=True)


@pytest.mark.parametrize(
    "values",
    [{"labeller": {"enabled": True, "label": "no-value-sign"}},
     {"labeller": {"enabled": True, "metricsPort": 0}},
     {"labeller": {"enabled": True, "unknown": 1}},
     {"labeller": {"enabled": True, "swapBehaviorSource": "Kubelet"}},
     {"labeller": {"enabled": True, "swapBehaviorSource": ""}}],
)
def test_bad_labeller_values_are_refused(chart: Chart, values: dict[str, object]) -> None:
    assert chart.error(values)


@pytest.mark.parametrize(("source", "guard"), [("declared", True), ("kubelet", True),
                                               ("declared", False)])
def test_the_pressure_guard_needs_nodes_proxy_like_the_kubelet_source(
    chart: Chart, source: str, guard: bool
) -> None:
    objs = chart.render({"labeller": {"enabled": True, "swapBehaviorSource": source,
                                      "pressureGuard": {"enabled": guard}}})
    cluster_role, args = _labeller(objs)
    assert cluster_role["rules"] == (
        [NODE_RULE, PROXY_RULE] if guard or source == "kubelet" else [NODE_RULE])
    assert ("--pressure-guard" in args) is guard


def test_unset_thresholds_leave_label_nodes_its_defaults(chart: Chart) -> None:
    _, args = _labeller(chart.render({"labeller": {"enabled": True,
                                                   "pressureGuard": {"enabled": True}}}))
    assert [a for a in args if a.startswith("--pressure")] == ["--pressure-guard"]


def test_set_thresholds_become_flags_label_nodes_accepts(chart: Chart) -> None:
    guard = {"enabled": True, "markAbove": 35, "clearBelow": 7.5, "markAfter": 90,
             "clearAfter": 300, "interval": 0.5}
    _, args = _labeller(chart.render({"labeller": {"enabled": True, "pressureGuard": guard}}))
    flags = {flag: _flag(args, flag) for flag in GUARD_FLAGS[1:]}
    assert flags == {"--pressure-interval": "0.5", "--pressure-mark-above": "35",
                     "--pressure-clear-below": "7.5", "--pressure-mark-after": "90",
                     "--pressure-clear-after": "300"}
    # What label-nodes makes of them (its own parser and checks).
    settings = pressure.PressureSettings(*(float(flags[f]) for f in (
        "--pressure-interval", "--pressure-mark-above", "--pressure-clear-below",
        "--pressure-mark-after", "--pressure-clear-after")))
    assert (settings.mark_above, settings.clear_below) == (35, 7.5)
    # Set but off: nothing is passed (label-nodes would check them, and not use them).
    _, args = _labeller(chart.render({"labeller": {"enabled": True, "pressureGuard": {
        **guard, "enabled": False}}}))
    assert not [a for a in args if a.startswith("--pressure")]


@pytest.mark.parametrize("form", ["label", "taint"])
def test_the_mark_form_becomes_the_flag_label_nodes_accepts(chart: Chart, form: str) -> None:
    _, args = _labeller(chart.render({"labeller": {"enabled": True, "pressureGuard": {
        "enabled": True, "markWith": form}}}))
    assert _flag(args, "--pressure-mark-with") == form
    # What label-nodes' own parser makes of the container's arguments.
    parsed = build_parser().parse_args(["label-nodes", *args])
    assert (parsed.pressure_guard, parsed.pressure_mark_with) == (True, form)


def test_the_documented_defaults_are_label_nodes_own() -> None:
    """The defaults are written once, in webhook/labeller/pressure.py; the chart README and
    docs/labeller.md quote them, and must quote them right."""
    figures = (f"{pressure.DEFAULT_MARK_ABOVE:g} / {pressure.DEFAULT_CLEAR_BELOW:g}",
               f"{pressure.DEFAULT_MARK_AFTER:g} / {pressure.DEFAULT_CLEAR_AFTER:g} / "
               f"{pressure.DEFAULT_INTERVAL:g}")
    readme = (CHART / "README.md").read_text()
    for text in figures:
        assert f"`null` ({text})" in readme, text
    values = (CHART / "values.yaml").read_text()
    assert (f"defaults ({pressure.DEFAULT_MARK_ABOVE:g}, {pressure.DEFAULT_CLEAR_BELOW:g}, "
            f"{pressure.DEFAULT_MARK_AFTER:g}, {pressure.DEFAULT_CLEAR_AFTER:g}; a read every "
            f"{pressure.DEFAULT_INTERVAL:g} s)") in " ".join(values.replace("#", "").split())
    docs = (REPO / "docs" / "labeller.md").read_text()
    table = dict(re.findall(r"^\| `(--pressure-[a-z-]+)` \| `([0-9.]+)` \|", docs, re.M))
    assert table == {"--pressure-interval": f"{pressure.DEFAULT_INTERVAL:g}",
                     "--pressure-mark-above": f"{pressure.DEFAULT_MARK_ABOVE:g}",
                     "--pressure-clear-below": f"{pressure.DEFAULT_CLEAR_BELOW:g}",
                     "--pressure-mark-after": f"{pressure.DEFAULT_MARK_AFTER:g}",
                     "--pressure-clear-after": f"{pressure.DEFAULT_CLEAR_AFTER:g}"}


@pytest.mark.parametrize("guard", [
    {"enabled": "yes"},
    {"enabled": True, "markAbove": 0},
    {"enabled": True, "markAbove": 101},
    {"enabled": True, "markWith": "annotation"},
    {"enabled": True, "clearBelow": "10"},
    {"enabled": True, "markAfter": -1},
    {"enabled": True, "interval": 0},
    {"enabled": True, "windows": 3},
])
def test_bad_guard_values_are_refused(chart: Chart, guard: dict[str, Any]) -> None:
    assert chart.error({"labeller": {"enabled": True, "pressureGuard": guard}})


def test_a_clear_threshold_above_the_mark_threshold_is_refused(chart: Chart) -> None:
    error = chart.error({"labeller": {"enabled": True, "pressureGuard": {
        "enabled": True, "markAbove": 30, "clearBelow": 31}}})
    assert "clearBelow (31) must not be above markAbove (30)" in error
