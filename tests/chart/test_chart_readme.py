"""The chart README's values table documents every value in values.yaml, and only those."""

from __future__ import annotations

import re
from typing import Any

import yaml
from chartlib import CHART


def leaf_paths(values: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            paths |= leaf_paths(value, f"{path}.")
        else:
            paths.add(path)
    return paths


def documented_keys() -> set[str]:
    """Keys of the Values table; `a.b` / `c` in one cell means `a.b` and `a.c`."""
    text = (CHART / "README.md").read_text()
    table = text[text.index("## Values"):]
    keys: set[str] = set()
    for row in re.findall(r"^\| (`[^|]*) \|", table, re.MULTILINE):
        names = re.findall(r"`([^`]+)`", row)
        parent = names[0].rpartition(".")[0]
        keys.add(names[0])
        keys |= {f"{parent}.{name}" if parent and "." not in name else name
                 for name in names[1:]}
    return keys


def test_every_value_is_documented() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    documented = documented_keys()

    def covered(path: str) -> bool:
        parts = path.split(".")
        return any(".".join(parts[:n]) in documented for n in range(1, len(parts) + 1))

    assert sorted(p for p in leaf_paths(values) if not covered(p)) == []


def test_no_documented_value_is_missing_from_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def exists(path: str) -> bool:
        node: Any = values
        for part in path.split("."):
            if not isinstance(node, dict) or part not in node:
                return False
            node = node[part]
        return True

    assert sorted(k for k in documented_keys() if not exists(k)) == []


def test_node_agent_section_names_what_it_renders() -> None:
    text = (CHART / "README.md").read_text()
    section = text[text.index("## Node agent"):text.index("## Values")]
    template = (CHART / "templates" / "node-agent.yaml").read_text()
    kinds = re.findall(r"^kind: (\w+)$", template, re.MULTILINE)
    assert len(kinds) == 7  # with the ConfigMap of kubelet.caBundle
    flat = " ".join(section.split())
    for kind in kinds:
        assert kind in flat, kind
    for said in ("`<fullname>-node-agent`", "`<fullname>-node-agent-kubelet-ca`",
                 '`request.userInfo.extra["authentication.kubernetes.io/node-name"]`',
                 "`nodes` `get`, `list`, `watch`, `patch`", "`nodes/configz` `get`"):
        assert said in flat, said


def test_values_say_which_nodes_the_node_agent_labels() -> None:
    """A NoSwap kubelet reports swap capacity too, and the agent leaves such nodes unlabelled."""
    text = (CHART / "values.yaml").read_text()
    comment = text[:text.index("\nnodeAgent:")].rsplit("\n\n", 1)[-1]
    flat = " ".join(line.lstrip("# -") for line in comment.splitlines())
    for said in ("exactly the swap nodes", "have swap AND whose kubelet runs swapBehavior "
                 "LimitedSwap", "NoSwap, reports capacity but gives pods no swap",
                 "swapwise.io/swap-permille", "only its own Node, only keys under swapwise.io/",
                 "never holds nodes/proxy"):
        assert said in " ".join(flat.split()), said
