"""The object names the docs give are the ones the chart creates (for the release `swapwise`
in namespace `swapwise`, as the README installs it): docs/audit.md said
`<release>-swapwise-policy` next to a command reading `swapwise-policy`, and the chart README
named Secrets `<release>-swapwise-tls` where the chart writes `<fullname>-tls`."""

from __future__ import annotations

import re

import yaml
from chartlib import CHART, Chart

REPO = CHART.parent.parent
# docs/node-agent.md once it is written (the node agent's page replaces docs/labeller.md).
DOCS = [REPO / "docs" / "audit.md", CHART / "README.md", REPO / "docs" / "node-agent.md"]


def test_object_names_in_the_docs_are_the_charts(chart: Chart) -> None:
    objects = chart.render({"audit": {"rbac": {"create": True}},
                            "nodeAgent": {"swapBehaviorSource": "kubelet",
                                          "kubelet": {"caBundle": "PEM"}}},
                           release="swapwise", namespace="swapwise")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for doc in (d for d in DOCS if d.exists()):
        text = doc.read_text()
        assert "<release>-swapwise-" not in text, doc  # an object name, not its definition
        for suffix in re.findall(r"`<fullname>(-[a-z-]+)`", text):
            assert any(name == f"swapwise{suffix}" for _, name in names), (doc, suffix)
    audit = (REPO / "docs" / "audit.md").read_text()
    [configmap] = re.findall(r"kubectl get configmap (\S+) -n swapwise", audit)
    assert ("ConfigMap", configmap) in names
    # The ClusterRole docs/audit.md shows is the chart's, rules and all.
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", audit, re.DOTALL)
               if "kind: ClusterRole" in b]
    documented = yaml.safe_load(block)
    [rendered] = [o for o in objects if o["kind"] == "ClusterRole"
                  and o["metadata"]["name"] == documented["metadata"]["name"]]
    assert documented["rules"] == rendered["rules"]
    # A user's binding must not take the name of the chart's own.
    [binding] = re.findall(r"kubectl create clusterrolebinding (\S+) ", audit)
    assert ("ClusterRoleBinding", binding) not in names
    chart_readme = (CHART / "README.md").read_text()
    for secret in ("swapwise-tls",):
        assert f"Secret `{secret}`" in chart_readme and ("Secret", secret) in names
