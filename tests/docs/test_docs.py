"""The docs' commands are the tested truth: each one runs here or in tests/e2e/test_docs.py.

Local commands run in order, as a new user would, in a scratch directory that links the
checkout's venv, examples and Makefile: `make run` (on a free port instead of 8443), then the
tour against it. Their output is checked against the doc's output blocks or, where a doc
states a result in prose, against that statement.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from testkit import docs
from testkit.server_proc import free_port

LINKED = (".venv", "examples", "charts", "Makefile")


def test_every_doc_command_has_a_rule() -> None:
    used: set[str] = set()
    for name in docs.DOCS:
        doc = docs.load(name)
        assert doc.commands, f"{name} has no commands: did the parser break?"
        for command in doc.commands:
            used.add(docs.rule_for(command).pattern)
    unused = [rule.pattern for rule in docs.RULES if rule.pattern not in used]
    assert not unused, f"rules no doc command uses any more: {unused}"


def test_never_run_commands_say_why() -> None:
    assert all(rule.reason for rule in docs.RULES if rule.where == docs.NEVER)


def test_parser_reads_blocks_as_documented() -> None:
    doc = docs.parse("x.md", "\n".join([
        "```sh",
        "# a comment line",
        "echo 'one",
        "two'   # trailing comment",
        "helm install a \\",
        "  --set b=c",
        "```",
        "",
        "```",
        "one...two",
        "```",
        "```yaml",
        "# values-x.yaml",
        "a: 1",
        "```",
    ]))
    assert [c.words for c in doc.commands] == ["echo one\ntwo", "helm install a --set b=c"]
    assert doc.commands[0].expected is None
    assert doc.commands[1].expected == ("one...two",)
    assert doc.files == {"values-x.yaml": "# values-x.yaml\na: 1\n"}


def test_output_matching() -> None:
    assert docs.missing_output(("memory: 683Mi",), "    memory: 683Mi\n", "") == []
    assert docs.missing_output(("memory: 683Mi",), "    memory: 683Mi2\n", "") == [
        "memory: 683Mi"]
    assert docs.missing_output(('{"a": ...x...}',), '{"a": 1, "x": 2}', "") == []
    assert docs.missing_output(('{"a": ...y...}',), '{"a": 1, "x": 2}', "") == [
        '{"a": ...y...}']
    # in order, warnings (stderr) first
    assert docs.missing_output(("W", "b", "a"), "a\nb\n", "W\n") == ["a"]


def test_e2e_readme_make_targets_are_the_makefile() -> None:
    """tests/e2e/README.md quotes the Makefile; the quote must be true."""
    text = (docs.REPO / "tests" / "e2e" / "README.md").read_text()
    block = re.search(r"```make\n(.*?)```", text, re.DOTALL)
    assert block, "tests/e2e/README.md lost its Makefile quote"
    makefile = (docs.REPO / "Makefile").read_text()
    for recipe in block.group(1).strip().split("\n\n"):
        assert recipe.strip() + "\n" in makefile, recipe


def test_no_doc_cites_a_spec_the_repository_lacks() -> None:
    offenders = []
    for path in docs.REPO.rglob("*"):
        parts = set(path.relative_to(docs.REPO).parts)
        if parts & {".git", ".venv", "build", ".mypy_cache", ".ruff_cache", ".pytest_cache"}:
            continue
        if path.suffix in {".md", ".py", ".yaml", ".json", ".tpl", ".txt", ".sh"} and \
                path.is_file() and path != Path(__file__) and "SPEC §" in path.read_text():
            offenders.append(str(path.relative_to(docs.REPO)))
    assert not offenders


# -- the local commands, run --------------------------------------------------------------

class DevServer:
    """`make run` as the README gives it, on a free port, in the scratch directory."""

    def __init__(self, cwd: Path, port: int, args: str = "") -> None:
        self.cwd, self.port = cwd, port
        self.log = cwd / f"make-run-{port}.log"
        # -o: never let make reinstall the venv from the scratch directory
        argv = ["make", "-o", ".venv/bin/.installed", "run", f"ARGS={args} --port {port}"]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        ca = self.cwd / "certs" / "ca.crt"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"make run exited: {self.log.read_text()}")
            try:
                context = ssl.create_default_context(cafile=str(ca))
                with urllib.request.urlopen(f"https://localhost:{self.port}/readyz",
                                            context=context, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (OSError, ssl.SSLError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"make run never became ready: {self.log.read_text()}")

    def stop(self) -> str:
        for _ in range(2):  # the second signal skips the drain
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        self.proc.wait(timeout=30)
        return self.log.read_text()


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    for name in LINKED:
        (tmp_path / name).symlink_to(docs.REPO / name)
    return tmp_path


def run(command: docs.Command, cwd: Path, port: int) -> subprocess.CompletedProcess[str]:
    text = command.text.replace("localhost:8443", f"localhost:{port}")
    return subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


def prose_warning() -> str:
    """The warning the README says `preview -o diff` of the Deployment prints."""
    readme = (docs.REPO / "README.md").read_text()
    found = re.search(r"Warnings\s+go\s+to\s+stderr\s+\(`([^`]*)`\)", readme)
    assert found, "README no longer says what preview warns"
    return " ".join(found.group(1).split())


def check_stated_result(command: docs.Command, out: subprocess.CompletedProcess[str],
                        cwd: Path) -> None:
    """What the docs say in prose about commands that have no output block."""
    words = command.words
    if words == ".venv/bin/swapwise preview -f examples/sandbox-pod.yaml":
        assert "memory: 683Mi" in out.stdout
        # restartPolicy: Never, so no resizePolicy (README after the curl output)
        assert "resizePolicy" not in out.stdout
    elif words == ".venv/bin/swapwise preview -f examples/deployment.yaml -o diff":
        assert prose_warning() in out.stderr.splitlines()
        assert out.stdout.startswith("---")
    elif "--profile ci -o json" in words:
        assert json.loads(out.stdout), out.stdout
        assert "swapwise.io/original" in out.stdout
    elif words.startswith(".venv/bin/swapwise policy check"):
        assert "valid" in out.stdout
    elif words.startswith(".venv/bin/swapwise certs"):
        directory = cwd / "certs" / "swapwise.swapwise"
        assert sorted(p.name for p in directory.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    elif words.startswith(".venv/bin/swapwise plan"):
        assert "cold memory fits in swap" in out.stdout
    elif words.startswith(".venv/bin/swapwise render admission-policy") and \
            "--format helm-values > rendered-values.yaml" in words:
        # chart README: the values file for mode admissionPolicy, the objects as data
        values = yaml.safe_load((cwd / "rendered-values.yaml").read_text())
        assert values["mode"] == "admissionPolicy"
        profiles = yaml.safe_load((cwd / "examples" / "policy.yaml").read_text())["profiles"]
        names = {(o["kind"], o["metadata"]["name"]) for o in values["admissionPolicy"]["objects"]}
        for profile in profiles:
            assert ("MutatingAdmissionPolicy", f"swapwise-{profile}") in names
    elif words.startswith(".venv/bin/swapwise render admission-policy"):
        # README: per profile a MutatingAdmissionPolicy, its binding and a Warn policy
        rendered = list(yaml.safe_load_all(out.stdout))
        profiles = yaml.safe_load((cwd / "examples" / "policy.yaml").read_text())["profiles"]
        names = {(o["kind"], o["metadata"]["name"]) for o in rendered}
        for profile in profiles:
            assert ("MutatingAdmissionPolicy", f"swapwise-{profile}") in names
            assert ("MutatingAdmissionPolicyBinding", f"swapwise-{profile}") in names
            assert ("ValidatingAdmissionPolicy", f"swapwise-{profile}-warn") in names
    else:
        assert command.expected is not None, f"nothing checks the output of {words!r}"


@pytest.mark.parametrize("name", [n for n in docs.DOCS if docs.LOCAL in {
    docs.rule_for(c).where for c in docs.load(n).commands}])
def test_local_commands(name: str, scratch: Path) -> None:
    doc = docs.load(name)
    port = free_port()
    server: DevServer | None = None
    curls: list[docs.Command] = []
    try:
        for command in doc.commands:
            if docs.rule_for(command).where != docs.LOCAL:
                continue
            if command.words == "make run":
                if server is None:
                    server = DevServer(scratch, port)
                continue
            out = run(command, scratch, port)
            where = f"{name}:{command.line}: {command.words}"
            assert out.returncode == 0, f"{where}\n{out.stderr}"
            if command.expected is not None:
                missing = docs.missing_output(command.expected, out.stdout, out.stderr)
                assert not missing, f"{where}: not in the output: {missing}\n{out.stdout}"
            check_stated_result(command, out, scratch)
            if command.words.startswith("curl "):
                curls.append(command)
        if server is None:
            return
        # The tour's `swapwise certs` must not have broken the running server (whose
        # certificate watcher would have acted within this time) ...
        time.sleep(2)
        for command in curls:
            again = run(command, scratch, port)
            assert again.returncode == 0, again.stderr
        # ... nor may the next `make run` make a new CA over the one given as caBundle.
        ca = (scratch / "certs" / "ca.crt").read_bytes()
        log = server.stop()
        server = None
        assert "certs/ca.crt" in log, log  # it says where the CA is
        server = DevServer(scratch, port)
        assert (scratch / "certs" / "ca.crt").read_bytes() == ca
    finally:
        if server is not None:
            server.stop()


def test_dev_server_listens_on_loopback_only(scratch: Path) -> None:
    server = DevServer(scratch, free_port())
    try:
        listening = subprocess.run(["ss", "-Hltn", f"sport = :{server.port}"],
                                   capture_output=True, text=True, check=True).stdout
        assert f"127.0.0.1:{server.port}" in listening, listening
        assert f"0.0.0.0:{server.port}" not in listening
    finally:
        server.stop()


def test_the_tour_works_with_the_example_policy_it_offers(scratch: Path) -> None:
    """The tour's first line offers `make run ARGS='--policy examples/policy.yaml'`; its
    next command, the curl to /mutate/default, got "unknown profile" from that policy and
    the one-liner then crashed with KeyError: 'patch'."""
    doc = docs.load("README.md")
    offered = re.search(r"# or: make run ARGS='([^']*)'", (docs.REPO / "README.md").read_text())
    assert offered, "the tour no longer offers the example policy"
    [curl, *_] = [c for c in doc.commands if c.words.startswith("curl ")]
    assert curl.expected is not None
    server = DevServer(scratch, free_port(), offered.group(1))
    try:
        out = run(curl, scratch, server.port)
        assert out.returncode == 0, out.stderr
        assert not docs.missing_output(curl.expected, out.stdout, out.stderr), out.stdout
        # A profile the policy lacks: no patch, a warning, and the one-liner prints it.
        unknown = docs.Command(curl.doc, curl.line, curl.text.replace("/mutate/default",
                                                                     "/mutate/nope"))
        out = run(unknown, scratch, server.port)
        assert out.returncode == 0, out.stderr
        assert out.stdout == ("[\"swapwise: unknown profile 'nope'; pod left unchanged\"]\n"), \
            out.stdout
    finally:
        server.stop()


def test_every_helm_command_installs_the_pushed_image_in_namespace_swapwise() -> None:
    """The chart README's install deployed swapwise:0.1.0 (in no registry; the image flags
    were in prose only) into swapwise-system, where every other doc uses swapwise."""
    helm = [c for name in docs.DOCS for c in docs.load(name).commands
            if c.words.startswith("helm ")]
    assert {c.doc for c in helm} == {"README.md", "charts/swapwise/README.md", "docs/guide.md"}
    for command in helm:
        where = f"{command.doc}:{command.line}: {command.words}"
        namespace = re.search(r"(?:-n|--namespace) (\S+)", command.words)
        assert namespace and namespace.group(1) == "swapwise", where
        if re.match(r"helm (install|upgrade)", command.words) and \
                "rendered-values.yaml" not in command.words:  # mode admissionPolicy: no image
            assert "--set image.repository=REGISTRY/swapwise --set image.tag=0.1.0" in \
                command.words, where


def test_make_help_lists_every_documented_target() -> None:
    """`make help`: each target that has a `##` comment above it, with that comment's first
    sentence; the targets are read from the Makefile here independently."""
    lines = (docs.REPO / "Makefile").read_text().splitlines()
    documented: list[str] = []
    doc = False
    for line in lines:
        if line.startswith("## "):
            doc = True
        elif line == "":
            doc = False
        elif re.match(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*:", line):
            if doc:
                documented.append(line.split(":")[0])
            doc = False
    assert {"run", "test", "unit", "e2e", "image", "demo", "help"} <= set(documented)
    out = subprocess.run(["make", "-s", "--no-print-directory", "help"], cwd=docs.REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and
              not line.startswith("   ")]
    assert listed == documented
    assert ("  run              Run the webhook on 127.0.0.1:8443: built-in policy, development "
            "certificates\n                   under certs/.\n") in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_the_guide_says_the_example_pod_stays_pending_until_a_node_has_both_labels() -> None:
    text = (docs.REPO / "docs" / "guide.md").read_text()
    after = text[text.index("kubectl apply -f examples/sandbox-pod.yaml -n sandboxes"):
                 text.index("## 5. Roll back")]
    flat = " ".join(after.split())
    assert "stays **Pending** until a node carries both labels" in flat
    assert "`swapwise.io/swap-node=true` and `swapwise.io/swap-permille`" in flat
