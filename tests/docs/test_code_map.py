"""docs/development.md "The code": the map lists every module of webhook/ once, where it is;
no two modules share a name; and the packages import downward only, in the layers it states."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

from testkit import docs

WEBHOOK = docs.REPO / "webhook"
# The layers "The code" states, lowest first: a module imports only from lower layers.
LAYERS = (("base", "__init__"), ("profile", "certs"), ("policy", "engine"),
          ("admission", "analysis", "render", "agent"), ("server",), ("cli",))
LAYER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def code_map() -> list[str]:
    """The paths the map names, as written (``webhook/engine/pod.py``, ``webhook/engine/``)."""
    text = (docs.REPO / "docs" / "development.md").read_text()
    section = text[text.index("\n## The code\n"):]
    block = re.search(r"\n```\n(.*?)\n```", section, re.DOTALL)
    assert block, "docs/development.md lost its code map"
    stack: list[str] = []
    paths = []
    for line in block.group(1).splitlines():
        entry = re.match(r"( *)([\w.-]+(?:/|\.py))(?:\s|$)", line)
        indent = len(line) - len(line.lstrip())
        if not entry or indent > 4 or indent % 2:
            continue  # a description going on
        depth = indent // 2
        assert depth <= len(stack), f"{line!r} is nested under nothing"
        stack[depth:] = [entry.group(2)]
        paths.append("".join(stack))
    return paths


def modules() -> list[Path]:
    return sorted(p.relative_to(docs.REPO) for p in WEBHOOK.rglob("*.py"))


def test_the_code_map_lists_every_module_once_where_it_is() -> None:
    listed = [p for p in code_map() if p.startswith("webhook/")]
    twice = [p for p, n in Counter(listed).items() if n > 1]
    assert not twice, twice
    files = {str(p) for p in modules()}
    packages = {f"{p.parent}/" for p in modules()}
    assert not set(listed) - files - packages, "the map names modules that do not exist"
    unlisted = {f for f in files if not f.endswith("/__init__.py")} - set(listed)
    assert not unlisted, f"modules the map leaves out: {sorted(unlisted)}"
    assert packages <= set(listed)


def test_no_two_modules_in_webhook_share_a_name() -> None:
    names = Counter(p.stem for p in modules() if p.name != "__init__.py")
    names.update(p.name for p in WEBHOOK.rglob("*") if p.is_dir() and p.name != "__pycache__")
    assert [name for name, n in names.items() if n > 1] == []


def _unit(module: str) -> str:
    """The package or top-level module of webhook/ that ``module`` (dotted) belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_packages_import_downward_only() -> None:
    upward = []
    for path in modules():
        here = _unit(".".join(path.with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [node.module] if node.module != "webhook" else \
                    [f"webhook.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            else:
                continue
            for module in found:
                if not module.startswith("webhook.") and module != "webhook":
                    continue
                there = _unit(module) if _unit(module) in LAYER else "__init__"
                if there != here and LAYER[there] >= LAYER[here]:
                    upward.append(f"{path}: {module}")
    assert not upward, upward
    assert set(LAYER) >= {_unit(".".join(p.with_suffix("").parts)) for p in modules()}
