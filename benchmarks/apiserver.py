"""What a pod creation pays for swapwise: API-server latency with and without the webhook,
and with the webhook-less mode (``swapwise render admission-policy``) instead.

    python -m benchmarks.apiserver [--pods 300] [--k8s 1.37]

Starts the e2e control plane (tests/e2e/cluster.py: etcd, kube-apiserver, scheduler,
controller-manager built by tests/e2e/build-control-plane.sh) and ``swapwise serve``,
registers the webhook for namespaces labelled ``swapwise.io/profile=sandbox``, then
creates the same 4-container pod alternately in such a namespace and in an unlabelled
one, over one keep-alive HTTPS connection with the admin certificate (kubectl would add
a process start per pod). The difference of the medians is swapwise's cost per pod:
the API server's webhook call (TLS, AdmissionReview encode/decode, our answer) and the
patch it applies and re-validates. Two more namespaces get the same profile from the
rendered admission policies instead (MutatingAdmissionPolicy + the Warn
ValidatingAdmissionPolicy, and the mutating policy alone): the CEL runs inside the API
server, with no call out. On 1.34 they need the v1beta1 API behind its feature gate.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import machine, percentile, report
from benchmarks.payloads import POLICY_YAML, pod
from tests.e2e.cluster import (
    BINARIES,
    DEFAULT_LINE,
    ControlPlane,
    Swapwise,
    bin_dir,
    free_port,
    missing_binaries,
    register_webhook,
    wait_for_mutation,
)
from webhook.policy import Policy, parse_policy
from webhook.render.admission_policy import render_admission_policies

WEBHOOK_NS, LEAN_NS, NOOP_NS, FLOOR_NS, PLAIN_NS = (
    "bench-swapwise", "bench-lean", "bench-noop", "bench-floor", "bench-plain")
POLICY_NS, POLICY_ONLY_NS = "bench-policy", "bench-policy-nowarn"
MUTATED = (WEBHOOK_NS, LEAN_NS, POLICY_NS, POLICY_ONLY_NS)
# "noop": the webhook is called, decides to leave the pod alone (its podSelector never
# matches) and answers without a patch, which separates the call from the patch.
# "lean": requests only (no resizePolicy, no placement), a 5-op patch instead of 10.
POLICY = POLICY_YAML + b"""\
  lean:
    swapRatio: 2
    resizePolicy: keep
    placement: {mode: none}
  noop:
    podSelector:
      matchLabels: {never: match}
"""
LABELS = {WEBHOOK_NS: "swapwise, patch", LEAN_NS: "swapwise, lean patch",
          NOOP_NS: "swapwise, no patch",
          FLOOR_NS: "minimal webhook (floor)", PLAIN_NS: "no webhook",
          POLICY_NS: "admission policies (mutate + warn)",
          POLICY_ONLY_NS: "admission policy (mutate only)"}


def bench_pod() -> dict[str, Any]:
    """payloads.pod(4) as a user would submit it (no owner, no service-account volume)."""
    template = pod(4)
    template["metadata"] = {"generateName": "bench-",
                            "labels": template["metadata"]["labels"]}
    spec = template["spec"]
    for key in ("volumes", "serviceAccount", "serviceAccountName"):
        spec.pop(key, None)
    for container in [*spec["containers"], *spec.get("initContainers", [])]:
        container.pop("volumeMounts", None)
    return template


def create(client: httpx.Client, namespace: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    reply = client.post(f"/api/v1/namespaces/{namespace}/pods", json=body)
    elapsed = time.perf_counter() - started
    if reply.status_code != 201:
        raise SystemExit(f"pod create in {namespace}: {reply.status_code} {reply.text[:300]}")
    annotations = reply.json()["metadata"].get("annotations") or {}
    if (namespace in MUTATED) != ("swapwise.io/profile" in annotations):
        raise SystemExit(f"unexpected mutation state in {namespace}: {annotations}")
    return elapsed * 1000


def webhook_seconds(client: httpx.Client) -> dict[str, tuple[float, float]]:
    """Per webhook: (sum, count) of the API server's own timing of its calls."""
    found: dict[str, tuple[float, float]] = {}
    prefix = "apiserver_admission_webhook_admission_duration_seconds_"
    for line in client.get("/metrics").text.splitlines():
        if not line.startswith(prefix) or 'type="admit"' not in line:
            continue
        name, _, value = line.rpartition(" ")
        hook = name.split('name="', 1)[1].split('"', 1)[0]
        total, count = found.get(hook, (0.0, 0.0))
        if name.startswith(prefix + "sum"):
            found[hook] = (total + float(value), count)
        elif name.startswith(prefix + "count"):
            found[hook] = (total, count + float(value))
    return found


def established(port: int) -> int:
    """TCP connections open to ``port`` (the API server reuses them: expect a few)."""
    wanted = f"{port:04X}"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{wanted}") and fields[3] == "01":  # local port, ESTABLISHED
            count += 1
    return count


def admission_policies(cp: ControlPlane, api_version: str) -> None:
    """The sandbox profile as rendered admission policies, under two profile names: one
    with the Warn policy, one without it (its binding left out)."""
    sandbox = parse_policy(POLICY.decode()).profiles["sandbox"]
    for name, namespace, warn in (("apsandbox", POLICY_NS, True),
                                  ("apnowarn", POLICY_ONLY_NS, False)):
        profile = dataclasses.replace(sandbox, name=name)
        objects = render_admission_policies(Policy(profiles={name: profile}), api_version)
        if not warn:
            objects = [o for o in objects if o["kind"] != "ValidatingAdmissionPolicyBinding"]
        cp.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        cp.create_namespace(namespace, {"swapwise.io/profile": name})
        wait_for_mutation(cp, namespace)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=300, help="pods per namespace")
    parser.add_argument("--k8s", default=DEFAULT_LINE,
                        help=f"Kubernetes line of the control plane (default {DEFAULT_LINE})")
    args = parser.parse_args()
    # Only kube-apiserver comes from --k8s: it is what admits pods (as in the e2e test).
    binaries = bin_dir(DEFAULT_LINE)
    apiserver = bin_dir(args.k8s) / "kube-apiserver"
    missing = missing_binaries(binaries, BINARIES)
    if missing or not apiserver.exists():
        raise SystemExit(f"control plane binaries missing ({', '.join(missing) or apiserver}):"
                         " run tests/e2e/build-control-plane.sh (SWAPWISE_K8S_VERSION="
                         f"{args.k8s} ... kube-apiserver for the API server)")
    api_version = "v1beta1" if args.k8s in ("1.34", "1.35") else "v1"
    gates = [] if api_version == "v1" else [
        "--feature-gates=MutatingAdmissionPolicy=true",
        "--runtime-config=admissionregistration.k8s.io/v1beta1=true"]
    work = Path(tempfile.mkdtemp(prefix="swapwise-bench-api-"))
    policy = work / "policy.yaml"
    policy.write_bytes(POLICY)
    with ControlPlane(binaries, apiserver_args=gates, apiserver=apiserver) as cp, \
            Swapwise(work / "swapwise", policy) as webhook:
        admission_policies(cp, api_version)
        cp.create_namespace(WEBHOOK_NS, {"swapwise.io/profile": "sandbox"})
        cp.create_namespace(LEAN_NS, {"swapwise.io/profile": "lean"})
        cp.create_namespace(NOOP_NS, {"swapwise.io/profile": "noop"})
        cp.create_namespace(FLOOR_NS, {"swapwise.io/profile": "floor"})
        cp.create_namespace(PLAIN_NS)
        register_webhook(cp, webhook.url_base, webhook.ca_bundle, ["sandbox", "lean", "noop"])
        floor_port = free_port()
        floor = subprocess.Popen([sys.executable, "-m", "benchmarks.floor", "--port",
                                  str(floor_port), "--cert-dir", str(webhook.cert_dir)])
        register_webhook(cp, f"https://127.0.0.1:{floor_port}", webhook.ca_bundle, ["floor"],
                         name="floor")
        wait_for_mutation(cp, WEBHOOK_NS)
        pki = cp.pki
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        client = httpx.Client(base_url=cp.server, verify=context, timeout=30)
        body = bench_pod()
        samples: dict[str, list[float]] = {ns: [] for ns in LABELS}
        with client:
            for _ in range(20):  # warm both paths (connections, caches, informers)
                for namespace in samples:
                    create(client, namespace, copy.deepcopy(body))
            before = webhook_seconds(client)
            for _ in range(args.pods):
                for namespace in samples:
                    samples[namespace].append(create(client, namespace, copy.deepcopy(body)))
            after = webhook_seconds(client)
        floor.terminate()
        floor.wait()
        connections = established(webhook.port)
        in_app = sorted(
            entry["duration_ms"] for entry in map(json.loads, (
                line for line in (work / "swapwise" / "swapwise.log").read_text().splitlines()
                if '"msg": "admission"' in line)))
    rows = []
    for namespace, values in samples.items():
        values.sort()
        rows.append([
            LABELS[namespace],
            str(len(values)), f"{percentile(values, 50):.2f}", f"{percentile(values, 90):.2f}",
            f"{percentile(values, 99):.2f}",
        ])
    without = percentile(samples[PLAIN_NS], 50)
    overhead = percentile(samples[WEBHOOK_NS], 50) - without
    call_only = percentile(samples[NOOP_NS], 50) - without
    any_webhook = percentile(samples[FLOOR_NS], 50) - without
    print(machine())
    report("Pod create through kube-apiserver (ms)", rows,
           ["namespace", "pods", "p50", "p90", "p99"])
    print(f"\nswapwise overhead per pod (difference of medians): {overhead:.2f} ms; "
          f"without a patch: {call_only:.2f} ms; a minimal webhook: {any_webhook:.2f} ms")
    medians = {ns: percentile(values, 50) for ns, values in samples.items()}
    print("ratios of medians (kube-apiserver "
          f"{args.k8s}): webhook / no mutation {medians[WEBHOOK_NS] / without:.2f}; "
          f"admission policies / no mutation {medians[POLICY_NS] / without:.2f}; "
          f"admission policies / webhook {medians[POLICY_NS] / medians[WEBHOOK_NS]:.2f}; "
          f"mutating policy only / webhook {medians[POLICY_ONLY_NS] / medians[WEBHOOK_NS]:.2f}")
    for hook, (total, count) in sorted(after.items()):
        base_total, base_count = before.get(hook, (0.0, 0.0))
        if count > base_count:
            print(f"API server's timing of calls to {hook}: mean "
                  f"{(total - base_total) / (count - base_count) * 1000:.2f} ms")
    print(f"open connections to swapwise at the end: {connections}")
    print(f"inside swapwise (body read to answer built): median "
          f"{percentile(in_app, 50):.3f} ms, p99 {percentile(in_app, 99):.3f} ms")


if __name__ == "__main__":
    main()
