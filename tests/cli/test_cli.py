"""The ``swapwise`` command line, run as a user runs it (a subprocess)."""

from __future__ import annotations

import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from testkit.server_proc import SWAPWISE, free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SWAP = "swapwise.io/swap-node"


def swapwise(*args: str, stdin: str | None = None, cwd: Path | None = None,
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SWAPWISE, *args], input=stdin, capture_output=True, text=True,
                          timeout=60, cwd=cwd)


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    kind = obj["kind"]
    if kind == "Pod":
        return obj["spec"]
    if kind == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def test_preview_pod_yaml() -> None:
    out = swapwise("preview", "-f", str(EXAMPLES / "sandbox-pod.yaml"))
    assert out.returncode == 0, out.stderr
    [result] = list(yaml.safe_load_all(out.stdout))
    container = result["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "683Mi"}
    # restartPolicy: Never -> no resizePolicy
    assert "resizePolicy" not in container
    assert result["metadata"]["annotations"]["swapwise.io/profile"] == "default"
    assert out.stderr == ("Warning: Pod/agent-sandbox-7f3c: swapwise: sandbox memory request "
                          "2Gi -> 683Mi (limit 2Gi)\n"
                          "Warning: Pod/agent-sandbox-7f3c: swapwise: needs nodes whose swap is "
                          ">= 1999\u2030 of their RAM (node label swapwise.io/swap-permille, "
                          "from the node agent)\n")


def test_preview_all_workload_kinds_from_stdin() -> None:
    container = {"name": "app", "image": "x",
                 "resources": {"limits": {"memory": "3Gi", "cpu": "1"}}}
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [container]}}
    docs: list[Any] = [
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {
            "containers": [container]}},
        *[{"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": kind.lower()},
           "spec": {"template": template}}
          for kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")],
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"},
         "spec": {"template": {"spec": {"containers": [container], "restartPolicy": "Never"}}}},
        {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "cron"},
         "spec": {"jobTemplate": {"spec": {"template": template}}}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "b"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}},
    ]
    out = swapwise("preview", "-f", "-", "-o", "json", stdin=yaml.safe_dump_all(docs))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["kind"] == "List"
    items = result["items"]
    assert [i["kind"] for i in items] == [d["kind"] for d in docs]
    for item in items[:7]:
        spec = pod_spec(item)
        assert spec["containers"][0]["resources"]["requests"] == {"memory": "1Gi"}
        placed = "affinity" in spec
        assert placed == (item["kind"] != "DaemonSet"), item["kind"]
    assert items[7:] == docs[7:]
    # one per container, and the swap-backing need (3Gi -> 1Gi: 2000) of each placed one
    assert out.stderr.count("Warning: ") == 13
    assert out.stderr.count("needs nodes whose swap is >= 2000\u2030") == 6
    assert "Warning: DaemonSet/daemonset: swapwise: app memory request 3Gi -> 1Gi" in out.stderr
    assert "Warning: DaemonSet/daemonset: swapwise: needs" not in out.stderr


def test_preview_list_kind_and_diff() -> None:
    pod = yaml.safe_load((EXAMPLES / "sandbox-pod.yaml").read_text())
    listing = {"apiVersion": "v1", "kind": "List", "items": [pod]}
    out = swapwise("preview", "-f", "-", "-o", "diff", stdin=json.dumps(listing))
    assert out.returncode == 0
    assert out.stdout.startswith("--- Pod/agent-sandbox-7f3c (original)\n")
    assert "-        memory: 2Gi\n+        memory: 683Mi\n" in out.stdout
    assert f"+          - key: {SWAP}\n" in out.stdout


def test_preview_example_deployment_with_policy_and_namespace_override(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump({
        "apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
        "profiles": {"browsers": {"swapRatio": 1}},
        "namespaces": {"browsers": {"requestRatio": 0.25}}}))
    args = ["preview", "-f", str(EXAMPLES / "deployment.yaml"), "--policy", str(policy)]
    out = swapwise(*args)  # one profile: --profile may be left out
    assert out.returncode == 0, out.stderr
    [deployment] = list(yaml.safe_load_all(out.stdout))
    spec = pod_spec(deployment)
    # namespace browsers comes from the manifest -> requestRatio 0.25
    assert spec["containers"][0]["resources"]["requests"]["memory"] == "768Mi"
    assert spec["initContainers"][0]["resources"]["requests"] == {"memory": "32Mi"}
    assert spec["initContainers"][0]["resizePolicy"][0]["restartPolicy"] == "RestartContainer"
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        assert {"key": SWAP, "operator": "In", "values": ["true"]} in term["matchExpressions"]
    other = swapwise(*args, "--namespace", "elsewhere")
    [deployment] = list(yaml.safe_load_all(other.stdout))
    assert pod_spec(deployment)["containers"][0]["resources"]["requests"]["memory"] == "1536Mi"


def test_preview_cronjob_example() -> None:
    policy = EXAMPLES / "policy.yaml"
    out = swapwise("preview", "-f", str(EXAMPLES / "cronjob.yaml"), "--policy", str(policy),
                   "--profile", "ci")
    assert out.returncode == 0, out.stderr
    spec = pod_spec(next(yaml.safe_load_all(out.stdout)))
    assert spec["containers"][0]["resources"]["requests"] == {"cpu": "4", "memory": "4Gi"}
    assert "resizePolicy" not in spec["initContainers"][0]
    assert spec["tolerations"] == [
        {"key": "swap", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--policy", str(EXAMPLES / "policy.yaml")], "--profile is required"),
        (["--policy", "/nonexistent.yaml"], "cannot read the policy file"),
    ],
)
def test_preview_errors(args: list[str], message: str) -> None:
    out = swapwise("preview", "-f", str(EXAMPLES / "sandbox-pod.yaml"), *args)
    assert out.returncode == 1 and message in out.stderr and out.stdout == ""


def test_preview_bad_input() -> None:
    out = swapwise("preview", "-f", "-", stdin="a: [")
    assert out.returncode == 1 and out.stderr.startswith(
        "swapwise: <stdin>: not valid YAML: line 1, column 5: while parsing a flow node, "
        "expected the node content, but found '<stream end>'")
    out = swapwise("preview", "-f", "/nonexistent.yaml")
    assert out.returncode == 1 and "cannot read /nonexistent.yaml" in out.stderr


# Hostile files (issue 29): a clear error, bounded input, never a traceback, for preview in
# every output form and for plan.
BILLION_LAUGHS = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: lol}\ndata:\n" + "".join(
    f"  {c}: &{c} [{', '.join([f'*{p}'] * 10)}]\n" for p, c in zip("abcdefgh", "bcdefghi",
                                                                  strict=True)
).replace("  b: &b [*a", "  a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n  b: &b [*a")
PLAN = ["--node-memory", "16Gi", "--node-swap", "32Gi", "--node-cpu", "8"]
HOSTILE: dict[str, tuple[bytes, str]] = {
    "billion laughs": (BILLION_LAUGHS.encode(), "more than 100000 values (aliases included)"),
    "20000 deep": (b"a: " + b"[" * 20000 + b"]" * 20000 + b"\n", "nested deeper than 64 levels"),
    "900 deep": (b"a: " + b"[" * 900 + b"]" * 900 + b"\n", "nested deeper than 64 levels"),
    "900 deep mappings": (b"a: " + b"{b: " * 900 + b"1" + b"}" * 900 + b"\n",
                          "nested deeper than 64 levels"),
    "not utf-8": (b"apiVersion: v1\nkind: Pod\nmetadata: {name: \xff}\n",
                  "not UTF-8 text: byte 0xff at line 3 (offset 42)"),
    "nul byte": (b"kind: Pod\x00\n", "not valid YAML: character 10: #x0000 is not allowed"),
}


@pytest.mark.parametrize("command", [["preview", "-o", "yaml"], ["preview", "-o", "json"],
                                     ["preview", "-o", "diff"], ["plan", *PLAN]],
                         ids=lambda c: " ".join(c[:3]))
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_manifests_are_refused_with_a_message(name: str, command: list[str],
                                                      tmp_path: Path) -> None:
    content, message = HOSTILE[name]
    path = tmp_path / "hostile.yaml"
    path.write_bytes(content)
    if name == "billion laughs":
        assert len(content) < 704  # the issue's had 704 bytes; 10^9 values once expanded
    out = swapwise(*command, "-f", str(path))
    assert (out.returncode, out.stdout) == (1, ""), out.stderr[-2000:]
    assert out.stderr.startswith(f"swapwise: {path}: {message}"), out.stderr[-2000:]
    assert len(out.stderr.splitlines()) == 1


def test_input_is_bounded_whatever_the_file_is(tmp_path: Path) -> None:
    """-f /dev/zero read without end; a file or stdin past 16 MiB is refused, and a 64-deep
    document (the most accepted) still goes through."""
    out = swapwise("preview", "-f", "/dev/zero")
    assert (out.returncode, out.stderr) == (
        1, "swapwise: /dev/zero: larger than 16 MiB, the most manifests are read\n")
    big = "# " + "x" * (16 * 1024 * 1024) + "\n"
    out = swapwise("plan", *PLAN, "-f", "-", stdin=big)
    assert (out.returncode, out.stderr) == (
        1, "swapwise: <stdin>: larger than 16 MiB, the most manifests are read\n")
    # Beside a pod: input without a workload is refused on its own (as in plan).
    pod = json.dumps(pod_doc("p", {"limits": {"memory": "1Gi"}})) + "\n---\n"
    deepest = "a: " + "[" * 64 + "]" * 64 + "\n"  # the mapping is level 0, its value 1
    out = swapwise("preview", "-f", "-", "-o", "json", stdin=pod + deepest)
    assert out.returncode == 0, out.stderr
    out = swapwise("preview", "-f", "-", "-o", "json", stdin=pod + "a: " + "[" * 65 + "]" * 65)
    assert out.stderr == "swapwise: <stdin>: nested deeper than 64 levels\n"


def test_manifests_joined_without_a_separator_are_refused() -> None:
    """cat pod.yaml deployment.yaml | swapwise preview -f -: the Pod's keys were silently
    overwritten by the Deployment's; duplicate keys are refused, as in policies."""
    pod, deployment = ((EXAMPLES / name).read_text() for name in ("sandbox-pod.yaml",
                                                                  "deployment.yaml"))
    joined = pod + deployment
    for command in (["preview"], ["plan", *PLAN]):
        out = swapwise(*command, "-f", "-", stdin=joined)
        assert out.returncode == 1 and out.stdout == ""
        line = joined.splitlines().index("apiVersion: apps/v1") + 1
        assert out.stderr == (f"swapwise: <stdin>: not valid YAML: line {line}, column 1: "
                              "duplicate key 'apiVersion' (two documents joined without '---'?)\n")
    out = swapwise("preview", "-f", "-", stdin=pod + "---\n" + deployment)
    assert out.returncode == 0, out.stderr
    assert [d["kind"] for d in yaml.safe_load_all(out.stdout)] == ["Pod", "Deployment"]


def test_preview_reads_a_directory_like_kubectl(tmp_path: Path) -> None:
    """-f DIR: its .json, .yaml and .yml files in name order; not other files, not its
    subdirectories (kubectl without -R)."""
    pod = yaml.safe_load((EXAMPLES / "sandbox-pod.yaml").read_text())
    for name, kind in (("b.yml", "b"), ("a.json", "a"), ("c.yaml", "c"), ("d.txt", "d")):
        (tmp_path / name).write_text(json.dumps({**pod, "metadata": {"name": kind}}))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "e.yaml").write_text(json.dumps({**pod, "metadata": {"name": "e"}}))
    out = swapwise("preview", "-f", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out.stdout)] == ["a", "b", "c"]
    empty = tmp_path / "sub" / "empty"
    empty.mkdir()
    out = swapwise("preview", "-f", str(empty))
    assert out.returncode == 1
    assert out.stderr == f"swapwise: {empty}: a directory without .json, .yaml or .yml files\n"


def pod_doc(name: str, resources: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **metadata},
            "spec": {"containers": [{"name": "app", "image": "x", "resources": resources}]}}


@pytest.mark.parametrize(("pod", "args", "note"), [
    (pod_doc("p", {}), [],
     "no container has a memory request or limit, so none can get swap; set defaultLimit in "
     "the profile to give them one"),
    (pod_doc("p", {"limits": {"memory": "1Gi"}}, labels={"swapwise.io/skip": "true"}), [],
     "opted out (never reshaped)"),
    (pod_doc("p", {"limits": {"memory": "2Gi"}}), ["--policy", str(EXAMPLES / "policy.yaml"),
                                                   "--profile", "sandbox"],
     "profile sandbox's podSelector does not select it (it reshapes only the pods it selects)"),
    ({**pod_doc("p", {"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}),
      "spec": {"nodeName": "n1", "containers": [{"name": "app", "resources": {
          "requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}}]}}, [],
     "every container with memory already has a request below its limit (it already gets "
     "swap), and spec.nodeName is set, so it gets no placement"),
])
def test_preview_says_why_it_leaves_a_workload_alone(pod: dict[str, Any], args: list[str],
                                                     note: str) -> None:
    """-o diff printed nothing and exit 0, with no word why; plan says it."""
    out = swapwise("preview", "-f", "-", "-o", "diff", *args, stdin=json.dumps(pod))
    assert (out.returncode, out.stdout) == (0, "")
    assert out.stderr == f"Note: Pod/p: left unchanged: {note}\n"


@pytest.mark.parametrize("kind", ["Pod", "StatefulSet"])
def test_preview_says_what_placement_it_adds_when_no_memory_changes(kind: str) -> None:
    """A request only (no limit): the memory is left alone, yet a required swap-node
    affinity was added with nothing on stderr; a StatefulSet with zonal volumes can then
    go Pending."""
    pod = pod_doc("p", {"requests": {"memory": "1Gi"}})
    doc = pod if kind == "Pod" else {
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "p"},
        "spec": {"serviceName": "p", "template": {"spec": pod["spec"]}}}
    out = swapwise("preview", "-f", "-", "-o", "diff", stdin=json.dumps(doc))
    assert out.returncode == 0, out.stderr
    assert any(line.startswith("+") and line.endswith(f"- key: {SWAP}")
               for line in out.stdout.splitlines()), out.stdout
    assert out.stderr == (
        f"Note: {kind}/p: no container's memory changes (each already gets swap), but "
        "swapwise adds a required node affinity (placement.mode: required of profile "
        f"default): it runs only on nodes with {SWAP}=true, and not on one marked "
        "swapwise.io/memory-pressure or swapwise.io/cpu-pressure; a workload whose "
        "volumes are bound to a zone "
        "without such a node stays Pending (placement.mode: preferred or none in the "
        "profile, or podSelector, leaves it out)\n"), out.stderr


@pytest.mark.parametrize("stdin", ["", "# nothing\n", "---\n---\n",
                                   "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
                                   "just: some yaml\n"])
def test_preview_of_input_without_a_workload_is_an_error_as_in_plan(stdin: str) -> None:
    """An empty or non-manifest file: preview printed nothing and exited 0, plan said
    "no Pod ... found" and exited 1."""
    preview = swapwise("preview", "-f", "-", stdin=stdin)
    plan = swapwise("plan", *PLAN, "-f", "-", stdin=stdin)
    assert (preview.returncode, preview.stdout) == (1, "")
    assert preview.stderr == plan.stderr == (
        "swapwise: no Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob "
        "found in the input\n")


def test_preview_says_a_reshaped_pod_is_already_in_shape() -> None:
    first = swapwise("preview", "-f", str(EXAMPLES / "sandbox-pod.yaml"))
    again = swapwise("preview", "-f", "-", "-o", "diff", stdin=first.stdout)
    assert (again.returncode, again.stdout) == (0, "")
    assert again.stderr == ("Note: Pod/agent-sandbox-7f3c: left unchanged: already in the shape "
                            "profile default gives (reshaped before)\n")


def test_preview_and_plan_print_warnings_whole() -> None:
    """The API server gets warnings of at most 120 characters; the command line gets them
    whole (preview cut one mid-sentence where plan printed it whole)."""
    from webhook.engine import mutate_pod
    from webhook.policy import default_policy

    broken = pod_doc("p", {"limits": {"memory": "lots-of-memory-please"}})
    message = ("swapwise: pod left unchanged: spec.containers[0].resources.limits.memory: "
               "'lots-of-memory-please' is not a valid quantity (e.g. 512Mi, 2Gi, 1.5G, 2e9)")
    [api] = mutate_pod(broken, default_policy().profiles["default"]).warnings
    assert len(message) > 120 and api == message[:117] + "..."
    out = swapwise("preview", "-f", "-", stdin=json.dumps(broken))
    assert out.stderr == f"Warning: Pod/p: {message}\n"
    name = "a-container-with-a-name-as-long-as-kubernetes-allows-sixty-three"
    long = pod_doc("p", {"limits": {"memory": "2Gi"}})
    long["spec"]["containers"][0]["name"] = name
    change = f"Warning: Pod/p: swapwise: {name} memory request 2Gi -> 683Mi (limit 2Gi)"
    for command in (["preview"], ["plan", *PLAN]):
        out = swapwise(*command, "-f", "-", stdin=json.dumps(long))
        assert out.returncode == 0, out.stderr
        assert change in out.stderr.splitlines(), out.stderr


def test_policy_check(tmp_path: Path) -> None:
    out = swapwise("policy", "check", str(EXAMPLES / "policy.yaml"))
    assert out.returncode == 0, out.stderr
    assert "valid; profiles: ci, default, sandbox" in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\nprofiles:\n"
                   "  a: {swapRatio: 2, requestRatio: 0.5}\n  b: {minRequest: 1X}\n")
    out = swapwise("policy", "check", str(bad))
    assert out.returncode == 1
    assert "profiles.a: give swapRatio or requestRatio, not both" in out.stderr
    assert "profiles.b.minRequest: '1X' is not a valid quantity" in out.stderr


def test_policy_check_gives_every_error_at_once_each_with_its_range_and_why(
        tmp_path: Path) -> None:
    """pydantic's words ("Input should be less than 1") without the valid range or the reason,
    and a namespace override's errors only once the profiles' were fixed."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: swapwise.io/v1alpha1\nkind: SwapPolicy\nprofiles:\n"
                   "  a: {requestRatio: 1.5, placement: {weight: 0}}\n"
                   "  b: {maxLimitRequestRatio: 1}\n"
                   "namespaces:\n  team-a: {swapRatio: -1}\n")
    out = swapwise("policy", "check", str(bad))
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"{bad}: invalid policy",
        "  profiles.a.requestRatio: 1.5 is out of range: valid is above 0 and below 1 (request "
        "= limit \u00d7 requestRatio: 0 is no request, 1 or more lowers none)",
        "  profiles.a.placement.weight: 0 is out of range: valid is 1 to 100 (the scheduler's "
        "range for the weight of a preferred term)",
        "  profiles.b.maxLimitRequestRatio: 1 is out of range: valid is above 1 (the largest "
        "limit ÷ request, as a LimitRange's: 1 or less leaves no request below a limit)",
        "  namespaces.team-a.swapRatio: -1 is out of range: valid is above 0 (node swap ÷ node "
        "RAM on the swap nodes: 0 or less gives no swap)",
    ], out.stderr


def test_policy_check_reads_stdin_as_preview_and_plan_do() -> None:
    text = (EXAMPLES / "policy.yaml").read_text()
    out = swapwise("policy", "check", "-", stdin=text)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("<stdin>: valid; profiles: ci, default, sandbox")
    out = swapwise("policy", "check", "-", stdin=text.replace("swapRatio: 2", "swapRatio: 0"))
    assert out.returncode == 1
    assert out.stderr.startswith("<stdin>: invalid policy\n  profiles.")
    assert "swapRatio: 0 is out of range" in out.stderr


def test_certs(tmp_path: Path) -> None:
    out = swapwise("certs", "--service", "swapwise", "--namespace", "infra", "--out",
                   str(tmp_path), "--days", "30", "--dns", "webhook.example.com",
                   "--ip", "10.0.0.7")
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "tls.key").st_mode) == 0o600
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == [
        "swapwise", "swapwise.infra", "swapwise.infra.svc", "swapwise.infra.svc.cluster.local",
        "webhook.example.com"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    cert.verify_directly_issued_by(ca)
    assert 29 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 31
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_certs_default_out_is_apart_from_the_dev_server(tmp_path: Path) -> None:
    out = swapwise("certs", "--service", "swapwise", "--namespace", "swapwise", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "certs" / "swapwise.swapwise" / "tls.crt").is_file()
    assert not (tmp_path / "certs" / "tls.crt").exists()


def test_certs_never_overwrite_without_force(tmp_path: Path) -> None:
    first = swapwise("certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path))
    assert first.returncode == 0, first.stderr
    ca = (tmp_path / "ca.crt").read_bytes()
    again = swapwise("certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path))
    assert again.returncode == 1 and "exists" in again.stderr and "--force" in again.stderr
    assert (tmp_path / "ca.crt").read_bytes() == ca
    forced = swapwise("certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path),
                      "--force")
    assert forced.returncode == 0, forced.stderr
    assert (tmp_path / "ca.crt").read_bytes() != ca


def test_dev_certs_keep_a_service_certificate(tmp_path: Path) -> None:
    """serve never makes a new CA over certificates written for a Service."""
    made = swapwise("certs", "--service", "s", "--namespace", "n", "--out",
                    str(tmp_path / "certs"))
    assert made.returncode == 0, made.stderr
    ca = (tmp_path / "certs" / "ca.crt").read_bytes()
    out = swapwise("serve", "--port", str(free_port()), cwd=tmp_path)
    assert out.returncode == 1
    assert "not a development certificate" in out.stderr and "--cert-dir" in out.stderr
    assert (tmp_path / "certs" / "ca.crt").read_bytes() == ca


def test_dev_certs_keep_their_ca_when_a_new_address_is_needed(tmp_path: Path) -> None:
    """A new address gets a serving certificate from the same CA (issue 46: a new CA broke
    every caBundle made from the old one); only a directory without the CA's key (made
    before swapwise kept it) gets a new CA, and says so."""
    from webhook import certs

    first, made = certs.ensure_dev_certs(tmp_path, [], [])
    assert made is None
    ca = first.ca.read_bytes()
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    again, made = certs.ensure_dev_certs(tmp_path, [], [])
    assert made is None and again.ca.read_bytes() == ca
    _, made = certs.ensure_dev_certs(tmp_path, ["dev.example"], ["10.1.2.3"])
    assert made is not None and "issued a new serving certificate from the existing CA" in made
    assert "new CA" not in made and first.ca.read_bytes() == ca
    cert = x509.load_pem_x509_certificate(first.cert.read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "dev.example" in san.get_values_for_type(x509.DNSName)
    assert {"10.1.2.3", "127.0.0.1"} <= {str(a) for a in san.get_values_for_type(x509.IPAddress)}
    (tmp_path / "ca.key").unlink()  # a directory of an earlier swapwise
    _, made = certs.ensure_dev_certs(tmp_path, [], ["10.1.2.4"])
    assert made is not None and "new CA" in made and "caBundle" in made
    assert first.ca.read_bytes() != ca


class DevServer:
    """`swapwise serve` with no certificate given: development certificates under certs/."""

    def __init__(self, cwd: Path) -> None:
        self.cwd, self.port = cwd, free_port()
        self.proc = subprocess.Popen([SWAPWISE, "serve", "--port", str(self.port),
                                      "--drain-seconds", "0"], cwd=cwd,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not self.serves_its_ca():
            assert self.proc.poll() is None and time.monotonic() < deadline, "never ready"
            time.sleep(0.2)

    def serves_its_ca(self) -> bool:
        """Whether it answers /readyz over TLS verified by certs/ca.crt as it is now."""
        try:
            context = ssl.create_default_context(cafile=str(self.cwd / "certs" / "ca.crt"))
            with urllib.request.urlopen(f"https://localhost:{self.port}/readyz",
                                        context=context, timeout=2) as answer:
                return bool(answer.status == 200)
        except (OSError, ssl.SSLError):
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def certs_in(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((directory / "certs").iterdir())}


def test_a_serve_that_cannot_listen_writes_nothing_and_keeps_the_running_servers_ca(
        tmp_path: Path) -> None:
    """`serve --host 10.255.255.1` (an address the machine lacks) made a new CA for that
    address, then failed to bind; the running `make run` server reloaded the new
    certificate and every caBundle made from the old CA broke."""
    out = swapwise("serve", "--host", "10.255.255.1", "--port", str(free_port()), cwd=tmp_path)
    assert out.returncode == 1
    assert "this machine has no address 10.255.255.1; --host takes one of its addresses" in \
        out.stderr
    assert not (tmp_path / "certs").exists()  # a fresh checkout: nothing written at all
    server = DevServer(tmp_path)
    try:
        before = certs_in(tmp_path)
        failed = [
            swapwise("serve", "--host", "10.255.255.1", "--port", str(free_port()), cwd=tmp_path),
            swapwise("serve", "--port", str(server.port), cwd=tmp_path),  # in use
            swapwise("serve", "--host", "10.255.255.1", "--policy", "missing.yaml",
                     cwd=tmp_path),
        ]
        for out in failed:
            assert out.returncode == 1, out.stderr
            assert "new CA" not in out.stderr and "development certificate" not in out.stderr
        time.sleep(1.5)  # the running server's certificate watcher would have acted by now
        assert certs_in(tmp_path) == before
        assert server.serves_its_ca()
    finally:
        server.stop()


def presented(host: str, port: int) -> bytes:
    """The certificate a server presents (DER), unverified."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection((host, port), timeout=5) as raw, \
            context.wrap_socket(raw) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_serve_on_another_address_keeps_the_ca_and_issues_a_certificate_from_it(
        tmp_path: Path) -> None:
    """`serve --host <an address the machine has>` made a new CA while another server was
    running: that server reloaded the new certificate, and clients holding the old ca.crt
    failed. The CA is kept; a serving certificate with the added address is issued from it,
    naming every name and address of the old one, so both servers serve it."""
    first = DevServer(tmp_path)
    second = None
    try:
        ca = (tmp_path / "certs" / "ca.crt").read_bytes()
        old = x509.load_pem_x509_certificate((tmp_path / "certs" / "tls.crt").read_bytes())
        port = free_port()
        second = subprocess.Popen(
            [SWAPWISE, "serve", "--host", "127.0.0.2", "--port", str(port),
             "--drain-seconds", "0"], cwd=tmp_path, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True)
        context = ssl.create_default_context(cafile=str(tmp_path / "certs" / "ca.crt"))
        context.check_hostname = False  # an address, not a name: the SANs are checked below

        def second_serves() -> bool:
            assert second is not None and second.poll() is None, "the second server exited"
            try:
                with urllib.request.urlopen(f"https://127.0.0.2:{port}/readyz",
                                            context=context, timeout=2) as answer:
                    return bool(answer.status == 200)
            except (OSError, ssl.SSLError):
                return False

        deadline = time.monotonic() + 30
        while not second_serves():
            assert time.monotonic() < deadline, "the second server never served"
            time.sleep(0.2)
        assert (tmp_path / "certs" / "ca.crt").read_bytes() == ca
        new_pem = (tmp_path / "certs" / "tls.crt").read_bytes()
        new = x509.load_pem_x509_certificate(new_pem)
        new.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))

        def sans(cert: x509.Certificate) -> set[str]:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            return {str(v) for v in [*san.get_values_for_type(x509.DNSName),
                                     *san.get_values_for_type(x509.IPAddress)]}

        assert sans(new) == sans(old) | {"127.0.0.2"}
        # The first server reloads the new certificate (its watcher), and its clients, who
        # hold the old ca.crt, still verify it.
        new_der = new.public_bytes(serialization.Encoding.DER)
        deadline = time.monotonic() + 30
        while presented("127.0.0.1", first.port) != new_der:
            assert time.monotonic() < deadline, "the first server never reloaded"
            time.sleep(0.2)
        assert first.serves_its_ca()
    finally:
        first.stop()
        if second is not None:
            second.terminate()
            _, err = second.communicate(timeout=30)
            assert "issued a new serving certificate" in err and "new CA" not in err, err


def test_serve_on_a_port_in_use_names_it_with_a_hint(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = swapwise("serve", "--port", str(port), cwd=tmp_path)
    assert out.returncode == 1
    assert out.stderr == (
        f"swapwise: cannot listen on 127.0.0.1:{port}: port {port} is in use (another swapwise "
        "serve, such as make run?); stop it, or choose another port with --port\n")
    assert not (tmp_path / "certs").exists()


def test_certs_bad_ip(tmp_path: Path) -> None:
    out = swapwise("certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path),
                   "--ip", "not-an-ip")
    assert out.returncode == 1 and "not an IP address" in out.stderr
    out = swapwise("certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path),
                   "--days", "3000000")
    assert out.returncode == 1 and "--days must be from 1 to 36500" in out.stderr, out.stderr


def test_certs_into_a_path_it_cannot_write_is_a_clear_error(tmp_path: Path) -> None:
    """--out an existing file, or below one, or where nothing can be created: tracebacks."""
    existing = tmp_path / "a-file"
    existing.write_text("mine\n")
    for out, reason in ((existing, "exists and is not a directory"),
                        (existing / "certs", "Not a directory"),
                        (Path("/proc/swapwise-certs"), "No such file or directory")):
        result = swapwise("certs", "--service", "s", "--namespace", "n", "--out", str(out))
        assert result.returncode == 1, result.stderr
        assert result.stderr.startswith(f"swapwise: --out {out}: "), result.stderr
        assert reason in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert existing.read_text() == "mine\n"


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--service", "Bad_Name", "not a Service name"),
    ("--service", "9lives", "not a Service name"),
    ("--service", "a" * 64, "not a Service name"),
    ("--namespace", "Team", "not a namespace name"),
    ("--dns", "web hook.example", "not a DNS name"),
])
def test_certs_refuse_names_kubernetes_would_not_accept(
        flag: str, value: str, message: str, tmp_path: Path) -> None:
    """A certificate for a name no Service can have would never be served: refused before
    anything is written."""
    args = {"--service": "swapwise", "--namespace": "team"}
    extra = ["--dns", value] if flag == "--dns" else []
    if flag != "--dns":
        args[flag] = value
    out = swapwise("certs", *[w for pair in args.items() for w in pair], *extra,
                   "--out", str(tmp_path / "out"))
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert out.stderr.startswith(f"swapwise: {flag} "), out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cert-dir", "x", "--tls-cert", "a", "--tls-key", "b"], "not both"),
        (["--tls-cert", "a"], "--tls-cert and --tls-key go together"),
        (["--cert-dir", "/nonexistent"], "cannot read"),
        (["--policy", "/nonexistent.yaml", "--cert-dir", "/nonexistent"],
         "cannot read the policy file: No such file or directory"),
        (["--port", "70000"], "out of range"),
    ],
)
def test_serve_refuses_bad_arguments(args: list[str], message: str, tmp_path: Path) -> None:
    out = swapwise("serve", *args, cwd=tmp_path)
    assert out.returncode == 1 and message in out.stderr, out.stderr


def test_every_command_help_says_what_it_does() -> None:
    """`serve --help` and `certs --help` had no description; every command has one now."""
    from webhook.cli import build_parser

    def commands(parser: Any, path: str = "") -> list[tuple[str, Any]]:
        found = []
        for action in parser._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    found.append((f"{path} {name}".strip(), sub))
                    found += commands(sub, f"{path} {name}")
        return found

    found = commands(build_parser())
    assert {name for name, _ in found} >= {"serve", "preview", "plan", "audit", "policy",
                                           "policy check", "render", "render admission-policy",
                                           "certs", "node-agent"}
    for name, parser in found:
        assert parser.description, name
    out = swapwise("serve", "--help")
    assert "Serve the admission webhook over HTTPS" in out.stdout
    assert "nothing is written there before the address can be listened on" in " ".join(
        out.stdout.split())
    out = swapwise("certs", "--help")
    assert "Write a new CA (ca.crt, the caBundle) and a serving certificate" in " ".join(
        out.stdout.split())


def test_help_lists_every_command() -> None:
    out = swapwise("--help")
    assert out.returncode == 0
    for command in ("serve", "preview", "policy", "certs"):
        assert command in out.stdout


def test_each_command_is_registered_by_the_module_named_for_it() -> None:
    """webhook/cli/<command>_cmd.py registers <command> and nothing else; every module of
    webhook/cli/ but common.py is a command's."""
    import argparse
    from importlib import import_module

    from webhook.cli import COMMANDS, command_module

    for command in COMMANDS:
        parser = argparse.ArgumentParser()
        subcommands = parser.add_subparsers()
        import_module(command_module(command)).register(subcommands)
        assert list(subcommands.choices) == [command]
    modules = {p.stem for p in (ROOT / "webhook" / "cli").glob("*.py")}
    assert modules - {"__init__", "common"} == {command_module(c).rsplit(".", 1)[1]
                                                for c in COMMANDS}


def test_node_agent_imports_its_own_module_only() -> None:
    """The agent runs on every node: `swapwise node-agent` must not import the other
    commands' modules, nor the policy model and pydantic they bring."""
    code = ("import sys\nfrom webhook.cli import main\n"
            "try:\n    main(['node-agent', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith(('webhook.cli.', 'pydantic', "
            "'webhook.policy'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True, cwd=ROOT)
    assert out.stdout.splitlines()[-1] == "['webhook.cli.node_agent_cmd']", out.stdout
