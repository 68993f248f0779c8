"""The shell commands of the user docs, and how the tests run each of them.

A ```sh block holds commands (comments and `\\`-continued lines as a shell reads them). A
plain ``` block right after one is the expected output of its last command: every line must
appear in the real output (stderr, then stdout) in that order; stripped lines compare equal,
and `...` stands for text left out within a line. A ```yaml block whose first line is
`# NAME` is the file NAME the following commands read.

Every command must match a rule below (the first match counts), so a command added to a doc
without a way to test it fails `test_every_doc_command_has_a_rule`.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "charts/swapwise/README.md", "docs/guide.md", "certs/README.md",
        "docs/development.md")
REGISTRY = "registry.example"  # stands for the user's REGISTRY


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    text: str  # as written, for bash
    expected: tuple[str, ...] | None = None  # the output block that follows, if any

    @property
    def words(self) -> str:
        """The command without comments, whitespace normalized: what rules match."""
        return " ".join(shlex.split(self.text.replace("\\\n", " "), comments=True))


@dataclass
class Doc:
    name: str
    commands: list[Command] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)


def _complete(text: str) -> bool:
    if text.endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def parse(name: str, markdown: str) -> Doc:
    doc = Doc(name)
    lines = markdown.splitlines()
    i = 0
    previous_sh_end = -2
    while i < len(lines):
        fence = re.match(r"^```(\S*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        lang, start = fence.group(1), i + 1
        end = start
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        body = lines[start:end]
        following_sh = all(not line.strip() for line in lines[previous_sh_end + 1 : i])
        if lang == "sh":
            buffer: list[str] = []
            for number, line in enumerate(body, start + 1):
                if not buffer and (not line.strip() or line.lstrip().startswith("#")):
                    continue
                buffer.append(line)
                text = "\n".join(buffer)
                if _complete(text):
                    doc.commands.append(Command(name, number - len(buffer) + 1, text))
                    buffer = []
            if buffer:
                raise ValueError(f"{name}:{start}: unterminated command {buffer[0]!r}")
            previous_sh_end = end
        elif lang == "" and following_sh and doc.commands:
            last = doc.commands.pop()
            doc.commands.append(Command(last.doc, last.line, last.text, tuple(body)))
        elif lang == "yaml" and body and re.fullmatch(r"# [\w.-]+\.yaml", body[0].strip()):
            doc.files[body[0].strip()[2:]] = "\n".join(body) + "\n"
        i = end + 1
    return doc


def load(name: str) -> Doc:
    return parse(name, (REPO / name).read_text())


def _line_matches(expected: str, actual: str) -> bool:
    want, have = expected.strip(), actual.strip()
    if "..." not in want:
        return want == have
    parts = want.split("...")
    if not (have.startswith(parts[0]) and have.endswith(parts[-1])):
        return False
    position = len(parts[0])
    for part in parts[1:-1]:
        found = have.find(part, position)
        if found < 0:
            return False
        position = found + len(part)
    return position <= len(have) - len(parts[-1])


def missing_output(expected: tuple[str, ...], stdout: str, stderr: str) -> list[str]:
    """Expected lines not found in order in the output (empty: it matches)."""
    actual = [*stderr.splitlines(), *stdout.splitlines()]
    missing: list[str] = []
    position = 0
    for want in expected:
        for index in range(position, len(actual)):
            if _line_matches(want, actual[index]):
                position = index + 1
                break
        else:
            missing.append(want)
    return missing


# -- rules: where each command runs ---------------------------------------------------------

LOCAL = "local"      # tests/docs/test_docs.py: in a scratch copy of the checkout, dev server
CLUSTER = "cluster"  # tests/e2e/test_docs.py: against a fresh local control plane
NEVER = "never"      # not run; the reason says why


@dataclass(frozen=True)
class Rule:
    pattern: str  # a regex the command's words must fully match
    where: str
    reason: str = ""


RULES = (
    Rule(r"make run", LOCAL),
    Rule(r"make test", NEVER, "it is the suite this test belongs to"),
    Rule(r"make (quick|unit|lint|e2e)", NEVER, "parts of the suite this test belongs to"),
    Rule(r"make help", NEVER, "prints the Makefile's documented targets (tests/docs/test_docs.py)"),
    Rule(r"curl -s --cacert certs/ca\.crt https://localhost:8443/\S+ -d .*", LOCAL),
    Rule(r"\.venv/bin/swapwise (preview|plan|policy check|certs|render admission-policy) .*",
         LOCAL),
    Rule(r"make demo", CLUSTER),
    Rule(r"make image( LOCAL_BASE=1)?", NEVER,
         "needs Docker Hub, or is what `make node` runs before tests/node runs the image"),
    Rule(r"skopeo copy .*", NEVER, "pushes to the user's registry"),
    Rule(r"helm (install|upgrade --install) swapwise charts/swapwise .* -f rendered-values\.yaml",
         NEVER, "mode admissionPolicy needs Kubernetes >= 1.36, the local control plane is 1.34; "
         "tests/e2e/test_helm_admission_policy.py installs such a file on kube-apiserver 1.37"),
    Rule(r"helm (install|upgrade --install) swapwise charts/swapwise .*", CLUSTER),
    Rule(r"helm uninstall swapwise .*", CLUSTER),
    Rule(r"kubectl .*rollout status .*", NEVER,
         "the local control plane has no kubelet to run the webhook's pods"),
    Rule(r"kubectl .*", CLUSTER),
)


def rule_for(command: Command) -> Rule:
    """The first rule whose pattern matches the whole command."""
    for rule in RULES:
        if re.fullmatch(rule.pattern, command.words, re.DOTALL):
            return rule
    raise LookupError(f"{command.doc}:{command.line}: no rule says how to test "
                      f"{command.words!r}; add one to testkit/docs.py")


def commands(where: str) -> list[Command]:
    return [c for name in DOCS for c in load(name).commands if rule_for(c).where == where]
