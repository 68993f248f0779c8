"""``swapwise audit``: what in a running cluster needs action, read-only.

The I/O is here (paged lists through :mod:`webhook.base.kubeapi`); every decision is
:func:`webhook.analysis.audit.audit`. Exit status 1 when a finding needs action, 2 when the audit
could not be made (a bad argument or policy file, the cluster could not be read, or what it
returned could not be judged): never a traceback, never 1. Read-only: the RBAC it needs is
in docs/audit.md.

The API server is an upstream like any other (:mod:`webhook.base.upstream`): ``--timeout``
bounds the whole read, every page and retry included; a busy server is retried with backoff,
each retry said on stderr; and every string the cluster returns is escaped before it is
printed (annotations and error messages are anyone's text).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from webhook.base.upstream import Backoff, Deadline, DeadlineExceeded, shown
from webhook.cli.common import CommandError, fail, policy_from
from webhook.profile import SWAP_LABEL

DEFAULT_TIMEOUT = 300.0


def register(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "audit",
        help="report what in the cluster needs action: pods not reshaped, reshaped pods "
             "without swap or on nodes that do not back them, HPAs/VPAs, LimitRanges/quotas, "
             "swap labels vs nodes, nodes marked under memory or CPU pressure, reshaped pods "
             "no node and no Karpenter NodePool can take (read-only)",
    )
    parser.add_argument("--kubeconfig",
                        help="kubeconfig file (default: in-cluster, else $KUBECONFIG or "
                             "~/.kube/config)")
    parser.add_argument("--policy",
                        help="the policy the webhook serves (default: built-in policy); with "
                             "the chart: kubectl get configmap <fullname>-policy "
                             "-o jsonpath='{.data.policy\\.yaml}' (swapwise-policy for the "
                             "release swapwise)")
    parser.add_argument("--label", default=f"{SWAP_LABEL}=true",
                        help=f"the swap-node label, key=value (default {SWAP_LABEL}=true)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                        help="seconds reading the cluster may take in all, every list, page "
                             f"and retry included (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    parser.set_defaults(func=run)


async def fetch(kubeconfig: str | None) -> Any:
    """List what the audit reads: Namespaces, Nodes and Karpenter NodePools (when the API
    is served), and in each opted-in namespace its Pods, ReplicaSets, HPAs, VPAs (when the
    API is served), LimitRanges, ResourceQuotas.

    Each list is paged and bounded (:func:`~webhook.base.kubeapi.list_objects`); a failure
    the server may recover from is retried after a delay that grows until a page arrives,
    and said on stderr. The whole is bounded by the caller (``--timeout``)."""
    # Imported here: only the commands that talk to a cluster need the client.
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.resources.apps_v1 import ReplicaSet
    from lightkube.resources.autoscaling_v2 import HorizontalPodAutoscaler
    from lightkube.resources.core_v1 import LimitRange, Namespace, Node, Pod, ResourceQuota

    from webhook.analysis.audit import Cluster, opted_in
    from webhook.base.kubeapi import NotServed, list_objects, make_client

    vpa_kind = create_namespaced_resource(
        "autoscaling.k8s.io", "v1", "VerticalPodAutoscaler", "verticalpodautoscalers")
    backoff = Backoff(report=lambda line: print(f"swapwise: audit: {line}", file=sys.stderr))
    client = make_client(kubeconfig)
    try:
        async def listing(resource: Any, namespace: str | None = None) -> list[Any]:
            return await list_objects(client, resource, namespace, backoff=backoff)

        namespaces = await listing(Namespace)
        nodes = await listing(Node)
        cluster: dict[str, Any] = {"namespaces": namespaces, "nodes": nodes, "pods": [],
                                   "replicasets": [], "hpas": [], "vpas": [],
                                   "limitranges": [], "quotas": []}
        cluster.update(await _nodepools(listing))
        # The audit's own reader: a listing of the wrong shape is said, not traced back.
        for name in opted_in(o for o in namespaces if isinstance(o, dict)):
            cluster["pods"] += await listing(Pod, name)
            cluster["replicasets"] += await listing(ReplicaSet, name)
            cluster["hpas"] += await listing(HorizontalPodAutoscaler, name)
            cluster["limitranges"] += await listing(LimitRange, name)
            cluster["quotas"] += await listing(ResourceQuota, name)
            if cluster["vpas"] is not None:
                try:
                    cluster["vpas"] += await listing(vpa_kind, name)
                except NotServed:  # the VPA API is not installed: the check is skipped
                    cluster["vpas"] = None
        return Cluster(**cluster)
    finally:
        await client.close()


def _read_error(exc: Exception) -> str:
    """Why the cluster could not be read, one line, escaped: the API server's message is
    anyone's text (a webhook's or an aggregated API's denial)."""
    from webhook.base.kubeapi import KubeError
    from webhook.base.upstream import BodyTooLarge, PagingError

    if isinstance(exc, KubeError | PagingError | BodyTooLarge):
        hint = ("; the ClusterRole it needs: docs/audit.md"
                if isinstance(exc, KubeError) and exc.status in (401, 403) else "")
        return shown(exc, 1000) + hint
    return f"{type(exc).__name__}: {shown(exc, 1000)}"


async def _nodepools(listing: Any) -> dict[str, Any]:
    """Karpenter's NodePools (what it knows of the nodes it would add, for the
    scale-from-zero check): ``nodepools`` None when the API is not served; when it cannot
    be read (e.g. forbidden), None and why, and the audit goes on without them."""
    from lightkube.generic_resource import create_global_resource

    from webhook.base.kubeapi import KubeError, NotServed

    kind = create_global_resource("karpenter.sh", "v1", "NodePool", "nodepools")
    try:
        return {"nodepools": await listing(kind)}
    except NotServed:
        return {"nodepools": None}
    except KubeError as exc:
        if exc.status == 403:
            return {"nodepools": None, "nodepools_problem": "forbidden (list nodepools "
                    "in karpenter.sh: docs/audit.md has the ClusterRole)"}
        raise


def render_table(report: Any, policy_source: str) -> str:
    """The report as a table; every string that came from the cluster (names, label values,
    annotations carried into messages) escaped, so none reaches the terminal as a control
    sequence or a line of its own."""
    lines = [f"policy: {shown(policy_source, 2000)}" + (
        " (give the webhook's with --policy FILE)" if policy_source == "built-in" else "")]
    if report.namespaces:
        opted = ", ".join(f"{shown(ns)} ({shown(profile)})"
                          for ns, profile in report.namespaces.items())
        lines.append(f"opted-in namespaces: {opted}")
    else:
        lines.append("opted-in namespaces: none (no namespace has the label "
                     "swapwise.io/profile)")
    for reason in report.skipped:
        lines.append(f"skipped: {shown(reason, 2000)}")
    if not report.findings:
        lines.append("nothing needs action")
        return "\n".join(lines) + "\n"
    rows = [["CHECK", "NAMESPACE", "OBJECT", "OWNER", "ACTION"]]
    for f in report.findings:
        rows.append([f.check, shown(f.namespace or "-"), shown(f.object), shown(f.owner or "-"),
                     "yes" if f.action else "no"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines.append("")
    for index, row in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if index:
            lines.append(f"    {shown(report.findings[index - 1].message, 10000)}")
    needing = sum(f.action for f in report.findings)
    lines += ["", f"{len(report.findings)} finding(s), {needing} needing action"]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from webhook.analysis.audit import audit

    key, sep, value = args.label.partition("=")
    if not key or not sep:
        fail(f"--label {args.label!r}: expected key=value")
        return 2
    try:
        policy = policy_from(args.policy)
    except CommandError as exc:
        fail(str(exc))
        return 2
    if not args.timeout > 0:  # also NaN
        fail(f"--timeout {args.timeout:g}: must be a positive number of seconds")
        return 2
    deadline = Deadline(args.timeout, "reading the cluster")
    try:
        cluster = asyncio.run(deadline.run(fetch(args.kubeconfig)))
    except DeadlineExceeded as exc:
        fail(f"audit: cannot read the cluster: {exc} (--timeout)")
        return 2
    except Exception as exc:  # no kubeconfig, unreachable server, forbidden: say which
        fail(f"audit: cannot read the cluster: {_read_error(exc)}")
        return 2
    try:
        report = audit(cluster, policy, (key, value))
    except Exception as exc:  # a shape of cluster data no check foresaw: a bug, said as one
        fail(f"audit: cannot judge what the cluster returned ({type(exc).__name__}: "
             f"{shown(exc, 200)}); this is a swapwise bug, please report it")
        return 2
    if args.output == "json":
        document = {"policy": policy.source, **report.to_json()}
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(report, policy.source))
    return 1 if report.needs_action else 0
