"""mode: admissionPolicy: the chart installs what `swapwise render admission-policy
--format helm-values` wrote, and nothing of the webhook; mode: webhook is unchanged.

The objects come from the renderer (the single home of the rules); the chart only checks
their kinds and API versions and adds its labels. What the installed policies do to pods is
proven on a real API server in tests/e2e/test_helm_admission_policy.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import CHART, REPO, Chart, kinds, one

from webhook.policy import build_policy
from webhook.render.admission_policy import helm_values, render_admission_policies

# The last commit before the chart had a mode: its webhook output is what mode webhook must
# still give, byte for byte. Move it forward only with a deliberate change of that output.
BEFORE_MODE = "e88458c05e5137f113284255a759afba7da9102e"
# Chart files changed deliberately since BEFORE_MODE, in what mode webhook renders but not by
# the mode: the comparison takes them as they are now. The dashboard: the labeller's
# swapwise_labeller_permille_nodes on its Swap nodes panel, and the pressure guard's panels;
# the rules: the pressure guard's alerts; the node agent (a DaemonSet, on by default) replaced
# the labeller (its template and its values; the values of everything else are unchanged since,
# so the old templates still render what they did); the helpers: the policy file's profiles get
# swapBacking "off" where no node agent writes the label backing needs (and the profile does
# not decide); the node agents' PodMonitor, new with them (issue 42), and the dashboard and
# rules over their metrics; the audit's ClusterRole lists Karpenter's NodePools (issue 44).
CHANGED_SINCE = ("files/dashboard.json", "files/prometheus-rules.yaml",
                 "templates/node-agent.yaml", "templates/_helpers.tpl", "values.yaml",
                 "values.schema.json", "templates/podmonitor.yaml",
                 "templates/audit-rbac.yaml")
REMOVED_SINCE = ("templates/labeller.yaml",)
SWAPWISE = str(Path(sys.executable).with_name("swapwise"))
AP_KINDS = ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
POLICY = {"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
          "profiles": {"sandbox": {"swapRatio": 2, "minRequest": "64Mi"},
                       "ci": {"requestRatio": 0.25, "placement": {"mode": "preferred"}}},
          "namespaces": {"team-a": {"minRequest": "128Mi"}}}
# Everything optional switched on, so "renders none of the webhook pieces" means something.
EVERYTHING = {
    "certs": {"mode": "certManager"},
    "nodeAgent": {"enabled": True, "swapBehaviorSource": "kubelet"},
    "audit": {"rbac": {"create": True}},
    "podDisruptionBudget": {"enabled": True},
    "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                "grafanaDashboard": {"enabled": True}},
}
SERVER_METRIC = re.compile(r"\bswapwise_(admission|containers_changed|policy|certificate|"
                           r"watcher)_")


def rendered_values(api_version: str = "v1") -> dict[str, Any]:
    return helm_values(render_admission_policies(build_policy(POLICY), api_version))


def merged(*parts: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(
                out.get(key), dict) else value
    return out


def live(api_version: str = "v1", *served: str) -> list[str]:
    """--api-versions as discovery of a live cluster gives them: with kinds."""
    kinds_served = served or tuple(AP_KINDS)
    group = "admissionregistration.k8s.io"
    versions = [f"{group}/{'v1' if k.startswith('Validating') else api_version}/{k}"
                for k in kinds_served]
    return [arg for v in ["v1/Pod", *versions] for arg in ("--api-versions", v)]


# ---- mode webhook: unchanged --------------------------------------------------------------


@pytest.fixture(scope="module")
def chart_before(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """charts/swapwise as it was at BEFORE_MODE (a clone with history has it)."""
    out = tmp_path_factory.mktemp("before")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_MODE, "charts/swapwise"],
                             capture_output=True, check=False)
    if archive.returncode != 0:  # a shallow clone (or an exported tree) has no history
        pytest.skip(f"commit {BEFORE_MODE} is needed to compare mode webhook's output with "
                    f"the chart before the mode: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    for name in CHANGED_SINCE:
        shutil.copyfile(CHART / name, out / "charts" / "swapwise" / name)
    for name in REMOVED_SINCE:
        (out / "charts" / "swapwise" / name).unlink()
    return out / "charts" / "swapwise"


# selfSigned certificates are random on every render: masked, everything else compared as is.
CERT_DATA = re.compile(r"^(\s*(?:caBundle|ca\.crt|tls\.crt|tls\.key):) \S+$", re.MULTILINE)
WEBHOOK_VALUES = [
    {},
    {"mode": "webhook"},
    EVERYTHING,
    {"certs": {"mode": "secret", "secretName": "tls", "caBundle": "Y2E="},
     "hostNetwork": {"enabled": True}, "replicaCount": 1,
     "policy": {"profiles": {"a": {"swapRatio": 3}, "default": None},
                "namespaces": {"x": {"minRequest": "64Mi"}}}},
    {"webhook": {"url": "https://127.0.0.1:8443", "failurePolicy": "Fail"},
     "metrics": {"prometheusRule": {"enabled": True}, "grafanaDashboard": {"enabled": True}}},
]


@pytest.mark.parametrize("values", WEBHOOK_VALUES, ids=lambda v: ",".join(v) or "defaults")
def test_mode_webhook_renders_byte_for_byte_what_the_chart_did_before_the_mode(
        chart: Chart, chart_before: Path, values: dict[str, Any]) -> None:
    before = chart.template_text({k: v for k, v in values.items() if k != "mode"},
                                 chart=chart_before)
    now = chart.template_text(values)
    assert CERT_DATA.sub(r"\1 X", now) == CERT_DATA.sub(r"\1 X", before)
    assert "MutatingAdmissionPolicy" not in now


BACKING_OFF_NOTE = re.compile(r"\n\nSwap backing is OFF for profile\(s\) .*?(?=\n\n|\n?\Z)",
                              re.DOTALL)
# The node agent's paragraphs, the last before the backing note (NOTES.txt).
NODE_AGENT_NOTE = re.compile(
    r"\n\nThe node agent runs on every Linux node:.*?(?=\n\nSwap backing|\n?\Z)", re.DOTALL)


def notes_of(chart: Chart, chart_dir: Path, values: dict[str, Any], workdir: Path) -> str:
    """NOTES.txt of any copy of the chart (Chart.notes renders charts/swapwise only)."""
    copy = workdir / "swapwise"
    shutil.copytree(chart_dir, copy)
    shutil.copy(copy / "templates" / "NOTES.txt", copy / "notes.tpl")
    (copy / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "notes.tpl") . | toJson }}}\n')
    text = chart.template_text(values, chart=copy,
                               extra=["--show-only", "templates/zz-notes.yaml"])
    return str(yaml.safe_load(text)["data"]["notes"])


@pytest.mark.parametrize("values", WEBHOOK_VALUES[2:], ids=lambda v: ",".join(v))
def test_mode_webhook_notes_are_unchanged(chart: Chart, chart_before: Path, tmp_path: Path,
                                          values: dict[str, Any]) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    now = notes_of(chart, CHART, values, tmp_path / "a")
    # New since: swap backing turned off for want of the node agent, or the node agent's own.
    agent = values.get("nodeAgent", {}).get("enabled", True)
    without, found = BACKING_OFF_NOTE.subn("", now)
    assert found == (0 if agent else 1), now
    without, found = NODE_AGENT_NOTE.subn("", without)
    assert found == (1 if agent else 0), now
    assert without == notes_of(chart, chart_before, values, tmp_path / "b")


# ---- mode admissionPolicy ----------------------------------------------------------------


def without_agent(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects but the node agent's (which renders in either mode, its own admission policy
    included: test_chart_node_agent.py)."""
    return [o for o in objs
            if o["metadata"]["labels"].get("app.kubernetes.io/component") != "node-agent"]


def test_installs_the_rendered_objects_as_they_are_with_the_chart_labels(chart: Chart) -> None:
    values = rendered_values()
    objs = without_agent(chart.render(values))
    installed = {(o["kind"], o["metadata"]["name"]): o for o in objs
                 if o["apiVersion"].startswith("admissionregistration.k8s.io/")}
    wanted = values["admissionPolicy"]["objects"]
    # 2 profiles and the team-a override of each, 4 objects apiece
    assert len(installed) == len(wanted) == 16
    for obj in wanted:
        got = json.loads(json.dumps(installed[(obj["kind"], obj["metadata"]["name"])]))
        labels = got["metadata"].pop("labels")
        want = json.loads(json.dumps(obj))
        own = want["metadata"].pop("labels")
        assert got == want  # spec, CEL included, unchanged by the trip through Helm
        assert labels["swapwise.io/profile"] == own["swapwise.io/profile"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/instance"] == "sw"
        assert labels["app.kubernetes.io/component"] == "admission-policy"
        assert labels["helm.sh/chart"] == "swapwise-0.1.0"


def test_renders_none_of_the_webhook_pieces(chart: Chart) -> None:
    objs = chart.render(merged(EVERYTHING, rendered_values()))
    names = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objs
                   if not o["apiVersion"].startswith("admissionregistration.k8s.io/"))
    assert names == [
        "ClusterRole/sw-swapwise-audit", "ClusterRole/sw-swapwise-node-agent",
        "ClusterRoleBinding/sw-swapwise-audit", "ClusterRoleBinding/sw-swapwise-node-agent",
        "ConfigMap/sw-swapwise-dashboard", "DaemonSet/sw-swapwise-node-agent",
        "PodMonitor/sw-swapwise-node-agent", "PrometheusRule/sw-swapwise",
        "ServiceAccount/sw-swapwise-audit", "ServiceAccount/sw-swapwise-node-agent",
    ]
    for kind in ("MutatingWebhookConfiguration", "Service", "Secret", "Issuer", "Certificate",
                 "ServiceMonitor", "PodDisruptionBudget"):
        assert kind not in kinds(objs), kind


def test_keeps_only_the_alerts_and_panels_that_need_no_server(chart: Chart) -> None:
    objs = chart.render(merged(EVERYTHING, rendered_values()))
    rules = [r for g in one(objs, "PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert [r["alert"] for r in rules] == ["SwapwiseReshapedPodOnNodeWithoutSwap",
                                           "SwapwiseContainerSwapNearLimit",
                                           "SwapwiseNodeMemoryPressure",
                                           "SwapwiseNodeCpuPressure",
                                           "SwapwiseSwapNodeWithoutAgent",
                                           "SwapwiseNodeAgentWatchFailing",
                                           "SwapwiseNodeAgentPatchErrors",
                                           "SwapwiseNodeAgentKernelReadErrors",
                                           "SwapwiseNodeAgentSwapUnknown"]
    source = yaml.safe_load((CHART / "files" / "prometheus-rules.yaml").read_text())
    kept = [r for g in source["groups"] for r in g["rules"]
            if not SERVER_METRIC.search(r["expr"])]
    assert rules == kept
    dashboard = json.loads(one(objs, "ConfigMap", "sw-swapwise-dashboard")["data"]
                           ["swapwise.json"])
    titles = [p["title"] for p in dashboard["panels"]]
    assert not SERVER_METRIC.search(json.dumps(dashboard["panels"]))
    assert "Webhook (swapwise serve)" not in titles
    assert "Node agents (swapwise node-agent)" in titles
    assert "Node swap usage" in titles
    # Everything else of the dashboard is the file's.
    source_dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    assert {k: v for k, v in dashboard.items() if k != "panels"} == \
        {k: v for k, v in source_dashboard.items() if k != "panels"}


def test_cli_values_file_installs(chart: Chart, tmp_path: Path) -> None:
    """The file users commit: `render ... --format helm-values`, then `helm ... -f` it."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    values = tmp_path / "rendered-values.yaml"
    out = subprocess.run([SWAPWISE, "render", "admission-policy", "--policy", str(policy),
                          "--format", "helm-values"], capture_output=True, text=True,
                         timeout=60, check=True)
    values.write_text(out.stdout)
    objs = without_agent(chart.render(extra=["-f", str(values)]))
    assert sorted(kinds(objs)) == sorted(AP_KINDS * 4)


def test_lint_strict_passes(chart: Chart) -> None:
    proc = chart.lint(merged(EVERYTHING, rendered_values()))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_objects_fails_clearly(chart: Chart) -> None:
    err = chart.error({"mode": "admissionPolicy"})
    assert "mode is admissionPolicy but admissionPolicy.objects is empty" in err
    assert "--format helm-values" in err


@pytest.mark.parametrize(("obj", "message"), [
    ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
     'admissionPolicy.objects[1]: kind "ConfigMap" is not installed in mode admissionPolicy, '
     "only MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding, "
     "ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding"),
    ({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
      "metadata": {"name": "x"}},
     'kind "MutatingWebhookConfiguration" is not installed'),
    ({"apiVersion": "example.com/v1", "kind": "MutatingAdmissionPolicy",
      "metadata": {"name": "x"}},
     'admissionPolicy.objects[1] (MutatingAdmissionPolicy x): apiVersion "example.com/v1" is '
     "not one of admissionregistration.k8s.io/v1, admissionregistration.k8s.io/v1beta1"),
])
def test_only_admission_policy_kinds_are_installed(chart: Chart, obj: dict[str, Any],
                                                   message: str) -> None:
    values = rendered_values()
    values["admissionPolicy"]["objects"].insert(1, obj)
    assert message in chart.error(values)


def test_schema_refuses_an_unknown_mode_and_shapeless_objects(chart: Chart) -> None:
    assert "/mode" in chart.error({"mode": "policy"})
    assert "metadata" in chart.error({"mode": "admissionPolicy",
                                      "admissionPolicy": {"objects": [{"apiVersion": "x",
                                                                       "kind": "y"}]}})


def test_a_cluster_without_the_api_is_refused_with_what_to_do(chart: Chart) -> None:
    # A 1.35 cluster as helm install sees it: v1beta1 only (feature gate on).
    err = chart.error(rendered_values("v1"), extra=live("v1beta1"))
    assert ("admissionPolicy.objects[0]: this cluster does not serve "
            "admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (swapwise-ci)") in err
    assert "GA (admissionregistration.k8s.io/v1) from Kubernetes 1.36" in err
    assert "--api-version v1beta1" in err
    # No MutatingAdmissionPolicy at all (1.34 without the gate): the binding is named too.
    err = chart.error(rendered_values("v1beta1"), extra=live("v1beta1", *AP_KINDS[2:]))
    assert "does not serve admissionregistration.k8s.io/v1beta1 MutatingAdmissionPolicy" in err
    # Served: installs.
    assert len(without_agent(chart.render(rendered_values("v1beta1"),
                                          extra=live("v1beta1")))) == 16
    assert len(without_agent(chart.render(rendered_values("v1"), extra=live("v1")))) == 16


def test_offline_template_checks_nothing_against_a_cluster(chart: Chart) -> None:
    """helm template without a cluster knows group versions only, not kinds: no API check
    (GitOps tools render offline)."""
    for api_version in ("v1", "v1beta1"):
        assert len(without_agent(chart.render(rendered_values(api_version)))) == 16


def test_notes_say_what_was_installed(chart: Chart) -> None:
    notes = chart.notes(rendered_values())
    assert "in mode admissionPolicy: no webhook server runs; the API server applies" in notes
    assert "  - MutatingAdmissionPolicy swapwise-sandbox\n" in notes
    assert "  - ValidatingAdmissionPolicyBinding swapwise-ci-ns-team-a-warn\n" in notes
    assert "(profiles: ci, sandbox)" in notes
    assert "swapwise.io/profile=ci" in notes
    assert "create --dry-run=server" in notes
    assert "rollout status daemonset/sw-swapwise-node-agent" in notes
    assert "MutatingWebhookConfiguration" not in notes
    assert "failurePolicy is Ignore: if a policy's CEL fails" in notes
    failing = helm_values(render_admission_policies(build_policy(POLICY), failure_policy="Fail"))
    assert "failurePolicy is Ignore" not in chart.notes(failing)
    assert "/mutate/" not in notes

