"""``swapwise audit``'s decisions: fetched cluster objects in, findings out.

Pure (no I/O, no clock): :func:`audit` takes the objects :mod:`webhook.cli.audit_cmd` listed
through the API server as plain dicts, plus the policy, and returns :class:`Finding`\\ s.
Whether a pod is "in shape" is decided by the same :func:`~webhook.engine.reshape`
the webhook runs: a running pod the engine would still patch is not.

Checks (``Finding.check``):

- ``unknown-profile``: a namespace opted in to a profile the policy does not have;
- ``pod-not-reshaped``: a pod not in the shape its profile gives (created before the
  namespace opted in, while the webhook was down, ...), with its owner;
- ``reshaped-pod-without-swap``: a reshaped pod bound to a node that gives no swap;
- ``reshaped-pod-not-backed``: a reshaped pod bound to a swap node whose swap share does not
  cover it: the node's ``swapwise.io/swap-permille`` (its label, else computed from its
  status) is below the pod's need (:mod:`webhook.engine.backing`);
- ``no-swap-permille-label``: reshaped pods exist but no node carries
  ``swapwise.io/swap-permille``, so placement that requires backing places no new one;
- ``hpa-memory-utilisation``: an HPA scaling a reshaped workload on memory utilisation;
- ``vpa``: a VerticalPodAutoscaler targeting a reshaped workload (an action when the
  profile says ``vpaPods: skip``: the webhook order defeated it);
- ``limitrange``: a LimitRange that refuses reshaped pods;
- ``resourcequota``: a ResourceQuota that refuses them, or caps what reshaping gains;
- ``node-swap-unlabelled`` / ``node-labelled-without-swap``: the swap label and the
  node's reported swap capacity disagree;
- ``node-memory-pressure`` / ``node-cpu-pressure``: a node carries the node agent's mark
  (``swapwise.io/memory-pressure`` or ``swapwise.io/cpu-pressure``, a label or a taint): no
  new reshaped pod with required placement is placed there, the reshaped pods already there
  keep stalling;
- ``reshaped-pods-unplaceable``: reshaped pods Pending with no node, and no node and no
  Karpenter NodePool carries the labels they require: nothing will ever place them (the
  autoscaling deadlock, :mod:`webhook.analysis.provisioning`, docs/autoscaling.md);
- ``node-permille-overstated``: the node agent measured a per-mille below the one declared
  for the node (NodePool, ``--node-labels``) before its first measurement;
- ``node-swap-noswap``: a node with swap capacity whose kubelet runs ``NoSwap`` (AKS today):
  pods get no swap there.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from webhook.analysis.hpa import utilisation_warnings
from webhook.analysis.planner import backing_off
from webhook.analysis.provisioning import (
    NODEPOOL_API,
    NodeTemplate,
    nodepool_templates,
    required_terms,
    swap_behavior,
    swapwise_keys,
    unplaceable,
)
from webhook.base.documents import size_problem
from webhook.base.quantity import (
    MI,
    QuantityError,
    parse_quantity,
    readable_bytes,
    readable_ratio,
)
from webhook.engine import backing, reshape
from webhook.engine.annotations import (
    ORIGINAL_ANNOTATION,
    PROFILE_ANNOTATION,
    original_pod,
    recorded_originals,
)
from webhook.engine.nodes import (
    BEHAVIOR_LABEL,
    NO_SWAP,
    NodeFacts,
    label_permille,
    status_permille,
    swap_capacity,
)
from webhook.engine.pod import MalformedPod, PodView
from webhook.engine.pressure import MARKS, Mark, marked
from webhook.engine.resources import effective_max_ratio
from webhook.engine.selection import ALWAYS_EXCLUDED_NAMESPACES, NAMESPACE_LABEL
from webhook.policy import Policy
from webhook.profile import SWAP_LABEL, Profile

VPA_GROUP = "autoscaling.k8s.io"

CHECKS = (
    "unknown-profile", "pod-not-reshaped", "reshaped-pod-without-swap",
    "reshaped-pod-not-backed", "no-swap-permille-label",
    "hpa-memory-utilisation", "vpa", "limitrange", "resourcequota",
    "node-swap-unlabelled", "node-labelled-without-swap", "node-memory-pressure",
    "node-cpu-pressure", "reshaped-pods-unplaceable", "node-permille-overstated",
    "node-swap-noswap",
)
PERMILLE_LABEL = backing.PERMILLE_LABEL


@dataclass(frozen=True)
class Cluster:
    """What the audit reads; every object a dict as the API server serves it."""

    namespaces: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    replicasets: list[dict[str, Any]] = field(default_factory=list)
    hpas: list[dict[str, Any]] = field(default_factory=list)
    vpas: list[dict[str, Any]] | None = None  # None: the VPA API is not served
    limitranges: list[dict[str, Any]] = field(default_factory=list)
    quotas: list[dict[str, Any]] = field(default_factory=list)
    nodepools: list[dict[str, Any]] | None = None  # None: Karpenter's API is not served
    nodepools_problem: str | None = None  # why NodePools could not be read, when served


@dataclass(frozen=True)
class Finding:
    check: str
    namespace: str | None
    object: str  # Kind/name
    message: str
    action: bool = True  # False: for information, does not fail the audit
    owner: str | None = None  # Kind/name of the pod's controller (through its ReplicaSet)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "check": self.check, "namespace": self.namespace, "object": self.object,
            "owner": self.owner, "action": self.action, "message": self.message,
            "details": self.details,
        }


@dataclass(frozen=True)
class Report:
    findings: list[Finding]
    namespaces: dict[str, str]  # opted-in namespace -> profile
    skipped: list[str]  # checks that could not run, objects that could not be read, and why

    @property
    def needs_action(self) -> bool:
        return any(f.action for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "needsAction": self.needs_action,
            "namespaces": self.namespaces,
            "skipped": self.skipped,
            "findings": [f.to_json() for f in self.findings],
        }


# ----------------------------------------------------------------------------- helpers


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _meta(obj: dict[str, Any], key: str) -> Any:
    metadata = obj.get("metadata")
    return metadata.get(key) if isinstance(metadata, dict) else None


def _name(obj: dict[str, Any]) -> str:
    name = _meta(obj, "name")
    return name if isinstance(name, str) and name else "<unnamed>"


def _namespace(obj: dict[str, Any]) -> str | None:
    namespace = _meta(obj, "namespace")
    return namespace if isinstance(namespace, str) else None


def _objects(items: Any, kind: str, skipped: list[str]) -> list[dict[str, Any]]:
    """The objects of a listing that the audit can read. Anything else is left out, and
    said in ``skipped``: an item that is not an object, a listing that is not a list, an
    object nested deeper than any real one (copying it would exhaust the stack). Cluster
    data of the wrong type is never traced back."""
    if not isinstance(items, list):
        skipped.append(f"{kind}: the listing is not a list; none read")
        return []
    found = []
    for item in items:
        problem = ("not an object" if not isinstance(item, dict)
                   else size_problem(item, max_values=None))
        if problem is None:
            found.append(item)
        else:
            name = _name(item) if isinstance(item, dict) else "?"
            skipped.append(f"{kind}: {name}: {problem}; not read")
    return found


def _shown(value: Any) -> str:
    """A value that is not text, named in a message by its type (``str()`` of a structure
    nested thousands deep would raise)."""
    return "null" if value is None else f"a {type(value).__name__}"


def _labels(obj: dict[str, Any]) -> dict[str, Any]:
    labels = _meta(obj, "labels")
    return labels if isinstance(labels, dict) else {}


def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    annotations = _meta(obj, "annotations")
    return annotations if isinstance(annotations, dict) else {}


def _controller(obj: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, name) of the controller ownerReference, else of the first one."""
    refs = _meta(obj, "ownerReferences")
    if not isinstance(refs, list):
        return None
    candidates = [r for r in refs if isinstance(r, dict)]
    candidates.sort(key=lambda r: r.get("controller") is not True)
    for ref in candidates:
        kind, name = ref.get("kind"), ref.get("name")
        if isinstance(kind, str) and isinstance(name, str):
            return kind, name
    return None


def _quantity(value: Any) -> Fraction | None:
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def _size(value: Fraction | int) -> str:
    return readable_bytes(math.ceil(value))


def active(pod: dict[str, Any]) -> bool:
    """Not finished and not being deleted: what admission would shape again on re-creation."""
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, dict) else None
    return phase not in ("Succeeded", "Failed") and _meta(pod, "deletionTimestamp") is None


def _uses_swap(pod: dict[str, Any]) -> bool:
    try:
        return any(PodView.parse(pod).swap_eligible())
    except MalformedPod:
        return False


def _memory_totals(pod: dict[str, Any]) -> tuple[Fraction, Fraction]:
    """(requests.memory, limits.memory) as ResourceQuota counts them: app containers and
    sidecars summed, against the largest plain init container."""
    view = PodView.parse(pod)
    totals = [Fraction(0), Fraction(0)]
    peaks = [Fraction(0), Fraction(0)]
    for c in view.containers:
        values = (Fraction(c.memory_request or 0), Fraction(c.memory_limit or 0))
        for i, value in enumerate(values):
            if c.kind == "init":
                peaks[i] = max(peaks[i], value)
            else:
                totals[i] += value
    return max(totals[0], peaks[0]), max(totals[1], peaks[1])


# ----------------------------------------------------------------------------- the audit


def opted_in(namespaces: Iterable[dict[str, Any]]) -> dict[str, str]:
    """Namespace -> the profile its label asks for (the ones the webhook covers)."""
    found = {}
    for ns in namespaces:
        name = _name(ns)
        wanted = _labels(ns).get(NAMESPACE_LABEL)
        if isinstance(wanted, str) and name not in ALWAYS_EXCLUDED_NAMESPACES:
            found[name] = wanted
    return found


@dataclass
class _Pod:
    obj: dict[str, Any]
    namespace: str
    profile: Profile
    owner: tuple[str, str] | None
    reshaped: bool  # carries swapwise's annotation
    after: dict[str, Any] | None  # the pod as the engine would still make it; None: in shape
    changes: list[str]  # the engine's warnings for it

    @property
    def ref(self) -> str:
        return f"Pod/{_name(self.obj)}"

    @property
    def owner_ref(self) -> str | None:
        return f"{self.owner[0]}/{self.owner[1]}" if self.owner else None


def audit(cluster: Cluster, policy: Policy, swap_label: tuple[str, str] = (SWAP_LABEL, "true"),
          ) -> Report:
    skipped: list[str] = []
    cluster = Cluster(
        namespaces=_objects(cluster.namespaces, "Namespace", skipped),
        nodes=_objects(cluster.nodes, "Node", skipped),
        pods=_objects(cluster.pods, "Pod", skipped),
        replicasets=_objects(cluster.replicasets, "ReplicaSet", skipped),
        hpas=_objects(cluster.hpas, "HorizontalPodAutoscaler", skipped),
        vpas=None if cluster.vpas is None else _objects(
            cluster.vpas, "VerticalPodAutoscaler", skipped),
        limitranges=_objects(cluster.limitranges, "LimitRange", skipped),
        quotas=_objects(cluster.quotas, "ResourceQuota", skipped),
        nodepools=None if cluster.nodepools is None else _objects(
            cluster.nodepools, "NodePool", skipped),
        nodepools_problem=cluster.nodepools_problem,
    )
    if cluster.nodepools_problem:
        skipped.append(f"NodePools ({NODEPOOL_API}): {cluster.nodepools_problem}; "
                       "reshaped-pods-unplaceable judged without them")
    templates = nodepool_templates(cluster.nodepools or [])
    findings: list[Finding] = []
    profiles: dict[str, Profile] = {}
    opted: dict[str, str] = {}
    for name, wanted in opted_in(cluster.namespaces).items():
        opted[name] = wanted
        profile = policy.resolve(wanted, name)
        if profile is None:
            findings.append(Finding(
                "unknown-profile", name, f"Namespace/{name}",
                f"opted in to profile {wanted!r}, which the policy does not have "
                f"({', '.join(sorted(policy.profiles))}): its pods are not reshaped",
            ))
            continue
        profiles[name] = profile

    rs_owner = {(_namespace(rs), _name(rs)): _controller(rs) for rs in cluster.replicasets}
    pods = _classify(cluster.pods, profiles, rs_owner)
    nodes = {_name(n): n for n in cluster.nodes}

    findings += _unshaped(pods)
    without = _without_swap(pods, nodes, swap_label)
    findings += without
    unbacked, unjudged = _not_backed(pods, nodes, {(f.namespace, f.object) for f in without})
    findings += unbacked
    skipped += unjudged
    findings += _no_permille_label(pods, cluster.nodes, templates)
    findings += _hpas(cluster.hpas, pods, profiles)
    if cluster.vpas is None:
        skipped.append(f"vpa: the {VPA_GROUP} API is not served by this cluster")
    else:
        findings += _vpas(cluster.vpas, pods, profiles)
    findings += _limitranges(cluster.limitranges, profiles)
    findings += _quotas(cluster.quotas, pods, profiles)
    findings += _nodes(cluster.nodes, swap_label)
    for mark in MARKS:
        findings += _pressure(mark, pods, cluster.nodes, swap_label)
    findings += _unplaceable(pods, cluster.nodes, templates, cluster.nodepools is not None)
    findings += _node_facts(cluster.nodes, swap_label)
    return Report(findings, dict(sorted(opted.items())), skipped)


def _classify(
    pods: Iterable[dict[str, Any]], profiles: dict[str, Profile],
    rs_owner: dict[tuple[Any, str], tuple[str, str] | None],
) -> list[_Pod]:
    found: list[_Pod] = []
    for pod in pods:
        namespace = _namespace(pod)
        profile = profiles.get(namespace) if namespace is not None else None
        if namespace is None or profile is None or not active(pod):
            continue
        owner = _controller(pod)
        if owner is not None and owner[0] == "ReplicaSet":
            owner = rs_owner.get((namespace, owner[1])) or owner
        result = reshape(pod, profile)
        after = result.after if result.changed else None
        reshaped = PROFILE_ANNOTATION in _annotations(pod)
        found.append(_Pod(pod, namespace, profile, owner, reshaped, after,
                          result.mutation.warnings))
    return found


def _unshaped(pods: list[_Pod]) -> list[Finding]:
    findings = []
    for pod in pods:
        if pod.after is None:
            continue
        changes = pod.changes
        what = ("; ".join(w.removeprefix("swapwise: ") for w in changes)
                or "no memory change: node placement or annotations missing")
        fix = (f"re-create it (e.g. kubectl rollout restart {pod.owner[0].lower()}/"
               f"{pod.owner[1]} -n {pod.namespace})" if pod.owner and pod.owner[0] in
               ("Deployment", "StatefulSet", "DaemonSet") else "re-create it")
        findings.append(Finding(
            "pod-not-reshaped", pod.namespace, pod.ref,
            f"not in the shape of profile {pod.profile.name} ({what}); admission reshapes "
            f"pods only when they are created: {fix}",
            owner=pod.owner_ref, details={"profile": pod.profile.name, "changes": changes},
        ))
    return findings


def _without_swap(
    pods: list[_Pod], nodes: dict[str, dict[str, Any]], swap_label: tuple[str, str],
) -> list[Finding]:
    findings = []
    key, value = swap_label
    for pod in pods:
        spec = pod.obj.get("spec")
        node_name = spec.get("nodeName") if isinstance(spec, dict) else None
        if not pod.reshaped or not isinstance(node_name, str) or not node_name \
                or not _uses_swap(pod.obj):
            continue
        node = nodes.get(node_name)
        reasons = []
        if node is None:
            reasons.append("the node is gone")
        else:
            if _labels(node).get(key) != value:
                reasons.append(f"the node has no label {key}={value}")
            capacity = swap_capacity(node)
            if not capacity:
                reasons.append("the node reports no swap capacity" if capacity is None
                               else "the node reports swap capacity 0")
        if reasons:
            findings.append(Finding(
                "reshaped-pod-without-swap", pod.namespace, pod.ref,
                f"reshaped for swap but runs on node {node_name}, which gives no swap "
                f"({'; '.join(reasons)}): its memory above the request cannot be paged out, "
                "so it is OOM-killed sooner than before; fix the node, or re-create the pod "
                "so the scheduler places it on a swap node",
                owner=pod.owner_ref, details={"node": node_name, "reasons": reasons},
            ))
    return findings


@dataclass(frozen=True)
class NodePermille:
    """A node's per-mille as the audit knows it: from its label, else its status."""

    value: int | None  # None: neither gives one
    source: str  # "label" | "status" | ""
    text: str  # where it comes from, for the message

    @classmethod
    def of(cls, node: dict[str, Any]) -> NodePermille:
        labels = _labels(node)
        if PERMILLE_LABEL in labels:
            raw = labels[PERMILLE_LABEL]
            value = label_permille(raw)
            if value is not None:
                return cls(value, "label", f"its label {PERMILLE_LABEL}")
            shown = f"={raw[:40]!r} is" if isinstance(raw, str) else f" is {_shown(raw)},"
            missing = (f"its label {PERMILLE_LABEL}{shown} not an integer the scheduler can "
                       "compare")
        else:
            missing = f"it has no label {PERMILLE_LABEL}"
        computed = status_permille(node)
        if computed.value is None:
            return cls(None, "", f"{missing}, and {computed.problem}")
        return cls(computed.value, "status",
                   f"computed from its status: swap {computed.swap} bytes, memory "
                   f"{computed.memory} bytes; {missing}")


def pod_need(pod: dict[str, Any]) -> tuple[int, dict[str, int]] | str:
    """The need of a running reshaped pod, and of each container counted: its current
    containers that swapwise changed (named in ``swapwise.io/original``, read by the
    engine's validating reader) whose request is below their limit. Why it cannot be
    known instead, when the pod or the annotation is unreadable: junk is never traced back.
    """
    try:
        view = PodView.parse(pod)
    except MalformedPod as exc:
        return f"the pod cannot be read ({exc})"
    if view.annotations.get(ORIGINAL_ANNOTATION) is None:
        return 0, {}  # swapwise changed no container (it added placement only)
    recorded, junk = recorded_originals(view)
    if junk:
        return (f"its {ORIGINAL_ANNOTATION} annotation is unreadable, so which containers "
                "swapwise changed is not known")
    pairs: dict[str, tuple[int, int]] = {}
    for container in view.containers:
        request, limit = container.memory_request, container.memory_limit
        if container.name in recorded and request is not None and limit is not None \
                and 0 < request < limit:
            # Whole bytes, as the kubelet reads quantities (Value() rounds up).
            pairs[container.name] = (math.ceil(request), math.ceil(limit))
    needs = {name: backing.container_need(*pair) for name, pair in pairs.items()}
    return backing.pod_need(pairs.values()), needs


def _not_backed(
    pods: list[_Pod], nodes: dict[str, dict[str, Any]], reported: set[tuple[str | None, str]],
) -> tuple[list[Finding], list[str]]:
    """Reshaped pods on nodes whose swap share does not cover them (and what could not be
    judged, for ``skipped``); pods already reported without swap are left out."""
    findings: list[Finding] = []
    unjudged: list[str] = []
    for pod in pods:
        spec = pod.obj.get("spec")
        node_name = spec.get("nodeName") if isinstance(spec, dict) else None
        node = nodes.get(node_name) if isinstance(node_name, str) else None
        if not pod.reshaped or node is None or (pod.namespace, pod.ref) in reported:
            continue
        where = f"{pod.namespace}/{_name(pod.obj)}"
        needed = pod_need(pod.obj)
        if isinstance(needed, str):
            unjudged.append(f"reshaped-pod-not-backed: Pod {where}: {needed}")
            continue
        need, containers = needed
        permille = NodePermille.of(node)
        if permille.value is None:
            unjudged.append(f"reshaped-pod-not-backed: Pod {where} on node {node_name}: "
                            f"{permille.text}")
            continue
        if backing.backed(need, permille.value):
            continue
        off = backing_off(pod.profile)
        worst = max(containers, key=lambda name: containers[name])
        if off is None:
            consequence = ("its placement requires backing, so the scheduler would not put it "
                           "there now (it was placed before the node's swap or memory changed "
                           "or before backing, or pinned by spec.nodeName): re-create it so "
                           "that it lands on a node that backs it, or give this node more swap")
        else:
            consequence = (f"backing is off for profile {pod.profile.name} ({off}), so nothing "
                           "keeps such pods off this node")
        findings.append(Finding(
            "reshaped-pod-not-backed", pod.namespace, pod.ref,
            f"needs swap-permille >= {need} (container {worst}) but runs on node {node_name}, "
            f"whose swap-permille is {permille.value} ({permille.text}): the swap the kubelet "
            f"gives it does not hold all its memory above the request, so it can be "
            f"OOM-killed under memory pressure; {consequence}",
            action=off is None, owner=pod.owner_ref,
            details={"node": node_name, "need": need, "containers": containers,
                     "nodePermille": permille.value, "permilleSource": permille.source,
                     "backingApplies": off is None},
        ))
    return findings, unjudged


def _no_permille_label(pods: list[_Pod], nodes: list[dict[str, Any]],
                       templates: list[NodeTemplate]) -> list[Finding]:
    """Reshaped pods exist (active, in opted-in namespaces) and no node carries the
    per-mille label at all, nor does any NodePool declare it (Karpenter then makes nodes
    that carry it: scaling from zero is not this)."""
    reshaped = [pod for pod in pods if pod.reshaped]
    if not reshaped or any(PERMILLE_LABEL in _labels(node) for node in nodes):
        return []
    if any(PERMILLE_LABEL in t.labels or any(r[0] == PERMILLE_LABEL for r in t.requirements)
           for t in templates):
        return []
    requiring = sorted({pod.profile.name for pod in reshaped if backing_off(pod.profile) is None})
    if requiring:
        message = (f"no node carries the label {PERMILLE_LABEL}, and {len(reshaped)} reshaped "
                   f"pod(s) exist: profile(s) {', '.join(requiring)} require swap backing "
                   "(placement.swapBacking: required, the default), so every new reshaped pod "
                   "of theirs stays Pending; run swapwise node-agent (chart: "
                   "nodeAgent.enabled: true, the default), or set placement.swapBacking: off")
    else:
        message = (f"no node carries the label {PERMILLE_LABEL}, and {len(reshaped)} reshaped "
                   "pod(s) exist; no profile of theirs requires swap backing, so they are placed "
                   "without it (run swapwise node-agent before turning it on)")
    return [Finding("no-swap-permille-label", None, "Node/*", message, action=bool(requiring),
                    details={"reshapedPods": len(reshaped), "profiles": requiring})]


def _by_workload(pods: list[_Pod]) -> dict[tuple[str, str, str], _Pod]:
    """One representative pod per (namespace, owner kind, owner name); reshaped ones, or
    ones the engine would reshape."""
    chosen: dict[tuple[str, str, str], _Pod] = {}
    for pod in pods:
        if pod.owner is None or not (pod.reshaped or pod.after is not None):
            continue
        chosen.setdefault((pod.namespace, *pod.owner), pod)
    return chosen


def _targeting(
    autoscalers: list[dict[str, Any]], ref_field: str, pods: list[_Pod],
    profiles: dict[str, Profile],
) -> Iterator[tuple[dict[str, Any], str, str, str, _Pod]]:
    """(autoscaler, namespace, kind, name, a pod of it) for each autoscaler in an opted-in
    namespace whose ``spec.<ref_field>`` names a reshaped workload: what HPAs and VPAs share."""
    workloads = _by_workload(pods)
    for autoscaler in autoscalers:
        namespace = _namespace(autoscaler)
        if namespace is None or namespace not in profiles:
            continue
        ref = _dict(autoscaler.get("spec")).get(ref_field)
        if not isinstance(ref, dict):
            continue
        kind, name = ref.get("kind"), ref.get("name")
        if not isinstance(kind, str) or not isinstance(name, str):
            continue
        pod = workloads.get((namespace, kind, name))
        if pod is not None:
            yield autoscaler, namespace, kind, name, pod


def _hpas(
    hpas: list[dict[str, Any]], pods: list[_Pod], profiles: dict[str, Profile],
) -> list[Finding]:
    findings = []
    for hpa, namespace, _, _, pod in _targeting(hpas, "scaleTargetRef", pods, profiles):
        if pod.after is not None:
            before, after = pod.obj, pod.after
        else:
            restored = original_pod(pod.obj)
            if restored is None:
                continue
            before, after = restored, pod.obj
        for warning in utilisation_warnings(hpa, before, after):
            findings.append(Finding(
                "hpa-memory-utilisation", namespace, f"HorizontalPodAutoscaler/{_name(hpa)}",
                warning.message(), owner=f"{warning.target_kind}/{warning.target_name}",
                details=warning.to_json(),
            ))
    return findings


def _vpas(
    vpas: list[dict[str, Any]], pods: list[_Pod], profiles: dict[str, Profile],
) -> list[Finding]:
    findings = []
    for vpa, namespace, kind, name, _pod in _targeting(vpas, "targetRef", pods, profiles):
        policy = _dict(vpa.get("spec")).get("updatePolicy")
        mode = policy.get("updateMode") if isinstance(policy, dict) else None
        mode = mode if isinstance(mode, str) else "Auto"
        vpa_pods = profiles[namespace].vpa_pods
        if mode == "Off":
            message, acts = (
                "recommendations only, nothing is applied; its memory recommendation is for "
                "the request before reshaping"), False
        elif vpa_pods == "skip":
            # The profile wants such pods left alone, yet they are reshaped: swapwise's
            # webhook saw them before the VPA's did (webhook order, or pods older than the VPA).
            message, acts = (
                "the profile says vpaPods: skip, but its pods were reshaped before the VPA's "
                "webhook saw them, so the VPA sets their requests and scales their limits in "
                "proportion; order swapwise's webhook after vpa-webhook-config, or set "
                "vpaPods: raiseLimit (docs/vpa.md)"), True
        else:
            message, acts = (
                "the VPA sets the memory requests and swapwise keeps the limits at about "
                "request / requestRatio (vpaPods: raiseLimit), in either webhook order; no "
                "eviction loop (docs/vpa.md)"), False
        findings.append(Finding(
            "vpa", namespace, f"VerticalPodAutoscaler/{_name(vpa)}",
            f"targets {kind}/{name}, whose memory requests swapwise lowers (updateMode "
            f"{mode}): {message}",
            action=acts, owner=f"{kind}/{name}", details={"updateMode": mode},
        ))
    return findings


def _limitranges(
    limitranges: list[dict[str, Any]], profiles: dict[str, Profile],
) -> list[Finding]:
    findings = []
    for lr in limitranges:
        namespace = _namespace(lr)
        profile = profiles.get(namespace) if namespace is not None else None
        if namespace is None or profile is None:
            continue
        limits = _dict(lr.get("spec")).get("limits")
        for item in limits if isinstance(limits, list) else []:
            if not isinstance(item, dict) or item.get("type") not in ("Container", "Pod"):
                continue
            problems = _limit_problems(item, profile)
            for problem, details in problems:
                findings.append(Finding(
                    "limitrange", namespace, f"LimitRange/{_name(lr)}",
                    f"type {item['type']}: {problem}", details=details,
                ))
    return findings


def _section(item: dict[str, Any], name: str) -> Fraction | None:
    section = item.get(name)
    return _quantity(section.get("memory")) if isinstance(section, dict) else None


def _limit_problems(item: dict[str, Any], profile: Profile) -> list[tuple[str, dict[str, Any]]]:
    problems: list[tuple[str, dict[str, Any]]] = []
    reshaped = effective_max_ratio(profile)
    cap = _section(item, "maxLimitRequestRatio")
    if cap is not None and reshaped > cap:
        # Limits from the smallest at which the engine's target is the ratio, not minRequest.
        smallest = max(int(profile.min_request / profile.request_ratio), MI)
        problems.append((
            f"maxLimitRequestRatio memory {readable_ratio(cap)}, but profile {profile.name} "
            f"makes limit/request up to {readable_ratio(reshaped)} (requestRatio "
            f"{readable_ratio(profile.request_ratio)}): reshaped pods with a memory limit from "
            f"about {_size(smallest)} up are refused; set maxLimitRequestRatio: "
            f"{readable_ratio(cap)} in "
            "the profile (or in a namespaces: override)",
            {"maxLimitRequestRatio": float(cap), "profileRatio": float(reshaped)},
        ))
    minimum = _section(item, "min")
    if item.get("type") == "Container" and minimum is not None \
            and minimum > profile.min_request:
        problems.append((
            f"min memory {_size(minimum)}, above profile {profile.name}'s minRequest "
            f"{_size(profile.min_request)}: containers whose reshaped request falls below it "
            f"(limits under about {_size(minimum / profile.request_ratio)}) are refused; set "
            f"minRequest: {_size(minimum)} in the profile",
            {"min": int(minimum), "minRequest": profile.min_request},
        ))
    maximum = _section(item, "max")
    if item.get("type") == "Container" and maximum is not None \
            and profile.default_limit is not None and profile.default_limit > maximum:
        problems.append((
            f"max memory {_size(maximum)}, below profile {profile.name}'s defaultLimit "
            f"{_size(profile.default_limit)}: containers given that limit are refused",
            {"max": int(maximum), "defaultLimit": profile.default_limit},
        ))
    return problems


def _quotas(
    quotas: list[dict[str, Any]], pods: list[_Pod], profiles: dict[str, Profile],
) -> list[Finding]:
    findings = []
    for quota in quotas:
        namespace = _namespace(quota)
        if namespace is None or namespace not in profiles:
            continue
        spec = _dict(quota.get("spec"))
        status = _dict(quota.get("status"))
        hard = _dict(spec.get("hard"))
        used = _dict(status.get("used"))
        # What re-creating the pods not yet in shape changes, per quota resource.
        delta = {"requests.memory": Fraction(0), "limits.memory": Fraction(0)}
        for pod in pods:
            if pod.namespace != namespace or pod.after is None:
                continue
            try:
                old, new = _memory_totals(pod.obj), _memory_totals(pod.after)
            except MalformedPod:
                continue
            delta["requests.memory"] += new[0] - old[0]
            delta["limits.memory"] += new[1] - old[1]
        delta["memory"] = delta["requests.memory"]
        for resource in ("requests.memory", "memory", "limits.memory"):
            limit = _quantity(hard.get(resource))
            if limit is None:
                continue
            current = _quantity(used.get(resource)) or Fraction(0)
            projected = current + delta[resource]
            if delta[resource] > 0 and projected > limit:
                findings.append(Finding(
                    "resourcequota", namespace, f"ResourceQuota/{_name(quota)}",
                    f"{resource}: used {_size(current)} of {_size(limit)}; re-created "
                    f"reshaped, this namespace's pods would need {_size(projected)} "
                    "(defaultLimit adds limits), so the quota refuses them: raise hard "
                    f"{resource} or lower the profile's defaultLimit",
                    details={"resource": resource, "hard": int(limit), "used": int(current),
                             "projected": int(projected)},
                ))
            elif resource == "limits.memory" and limit and current >= limit * Fraction(9, 10):
                findings.append(Finding(
                    "resourcequota", namespace, f"ResourceQuota/{_name(quota)}",
                    f"limits.memory: used {_size(current)} of {_size(limit)}: swapwise lowers "
                    "requests, not limits, so this quota refuses the extra pods reshaping "
                    "makes room for; raise it if the density is wanted",
                    action=False,
                    details={"resource": resource, "hard": int(limit), "used": int(current)},
                ))
    return findings


def _nodes(nodes: list[dict[str, Any]], swap_label: tuple[str, str]) -> list[Finding]:
    findings = []
    key, value = swap_label
    for node in nodes:
        name = _name(node)
        labels = _labels(node)
        labelled = labels.get(key) == value
        capacity = swap_capacity(node)
        if labelled and not capacity:
            findings.append(Finding(
                "node-labelled-without-swap", None, f"Node/{name}",
                f"labelled {key}={value} but reports "
                f"{'no swap capacity' if capacity is None else 'swap capacity 0'}: reshaped "
                "pods are placed there and get no swap; remove the label (swapwise "
                "node-agent keeps it true) or enable swap",
                details={"swapCapacity": capacity},
            ))
        elif capacity and not labelled and \
                swap_behavior(node) != NO_SWAP:  # node-swap-noswap's
            findings.append(Finding(
                "node-swap-unlabelled", None, f"Node/{name}",
                f"reports swap capacity {_size(capacity)} but has no label {key}={value}: "
                "if its kubelet runs swapBehavior LimitedSwap, label it (swapwise "
                "node-agent does); reshaped pods are not placed there",
                details={"swapCapacity": capacity,
                         "swapBehavior": labels.get(BEHAVIOR_LABEL)},
            ))
    return findings


def _pressure(mark: Mark, pods: list[_Pod], nodes: list[dict[str, Any]],
              swap_label: tuple[str, str]) -> list[Finding]:
    """Nodes the node agent marked for ``mark``: what it says, and who is stuck there or
    kept out."""
    key, value = swap_label
    carrying = [node for node in nodes if mark.forms(node)]
    if not carrying:
        return []
    swap_nodes = [node for node in nodes if _labels(node).get(key) == value]
    every = bool(swap_nodes) and all(marked(node) for node in swap_nodes)
    stall = "swap-in" if mark.resource == "memory" else "CPU"
    remedy = ("move or resize those with the largest hot memory, or give the node more RAM"
              if mark.resource == "memory" else
              "move or limit the busiest pods, or give the node more CPU")
    findings = []
    for node in sorted(carrying, key=_name):
        name = _name(node)
        forms = mark.forms(node)
        note = _annotations(node).get(mark.key)
        note = note if isinstance(note, str) and note else None
        here = sorted(f"{pod.namespace}/{_name(pod.obj)}" for pod in pods if pod.reshaped
                      and _dict(pod.obj.get("spec")).get("nodeName") == name)
        why = f"({note})" if note else "(no annotation: not marked by swapwise node-agent?)"
        kept_off = ("new reshaped pods with required placement are not placed there"
                    if "label" in forms else "")
        if "taint" in forms:
            kept_off += ("; " if kept_off else "") + (
                "no new pod that does not tolerate its NoSchedule taint is placed there")
        message = (f"marked {mark.key} ({' and '.join(sorted(forms))}) by the node agent "
                   f"{why}: {kept_off}; "
                   f"{len(here)} reshaped pod(s) already there keep stalling on {stall} "
                   f"(swapwise evicts nothing): {remedy}")
        if "label" in forms and here:
            message += ("; while the label is on, a restart of the node's kubelet fails "
                        "them (it re-admits pods against their node affinity, reason "
                        "NodeAffinity)")
        if every:
            message += (f"; every node labelled {key}={value} is marked, so new reshaped pods "
                        "with required placement stay Pending until one is cleared")
        findings.append(Finding(
            f"node-{mark.resource}-pressure", None, f"Node/{name}", message,
            details={"annotation": note, "reshapedPods": here, "everySwapNodeMarked": every,
                     "markedWith": sorted(forms)},
        ))
    return findings


def _unplaceable(pods: list[_Pod], nodes: list[dict[str, Any]],
                 templates: list[NodeTemplate], nodepools_served: bool) -> list[Finding]:
    """Reshaped pods Pending with no node whose swapwise labels no node has and no NodePool
    declares: the scale-from-zero deadlock (docs/autoscaling.md). One finding per namespace,
    owner and set of missing labels."""
    node_labels = [_labels(node) for node in nodes]
    groups: dict[tuple[str, str | None, tuple[str, ...]], list[tuple[_Pod, bool]]] = {}
    for pod in pods:
        spec = _dict(pod.obj.get("spec"))
        if not pod.reshaped or spec.get("nodeName") or \
                _dict(pod.obj.get("status")).get("phase", "Pending") != "Pending":
            continue
        keys = swapwise_keys(pod.profile.placement.node_selector)
        found = unplaceable(required_terms(pod.obj, keys), node_labels, templates)
        if found is None:
            continue
        missing = tuple(e.text() for e in found.missing)
        groups.setdefault((pod.namespace, pod.owner_ref, missing), []).append(
            (pod, found.together))
    findings = []
    pools = sorted(t.name for t in templates)
    for (namespace, owner, missing), members in sorted(
            groups.items(), key=lambda item: (item[0][0], item[0][1] or "", item[0][2])):
        names = sorted(_name(pod.obj) for pod, _ in members)
        together = members[0][1]
        wanted = " and ".join(missing)
        if together:
            lack = f"no node and no NodePool has all of {wanted} at once"
        else:
            lack = f"no node has {wanted}, and no NodePool declares it"
        if not nodepools_served:
            where = ("this cluster serves no Karpenter NodePools (karpenter.sh/v1): if "
                     "cluster-autoscaler adds nodes, its node groups' templates (ASG tags, "
                     "node pool labels) must declare them, and the kubelets' --node-labels too")
        elif pools:
            where = (f"NodePool(s) {', '.join(pools)} do not declare them: declare them in the "
                     "swap pool's spec.template.metadata.labels (a per-mille the nodes' swap "
                     "really gives)")
        else:
            where = ("no NodePool exists: create one for swap nodes that declares them in "
                     "spec.template.metadata.labels")
        findings.append(Finding(
            "reshaped-pods-unplaceable", namespace, f"Pod/{names[0]}",
            f"{len(names)} reshaped pod(s) Pending with no node: {lack}, so the scheduler "
            f"places none of them and no autoscaler adds a node that would take them; "
            f"{where} (docs/autoscaling.md)",
            owner=owner,
            details={"pods": names, "missing": list(missing), "nodePools": pools,
                     "nodePoolsServed": nodepools_served, "eachProvidedSomewhere": together},
        ))
    return findings


def _node_facts(nodes: list[dict[str, Any]], swap_label: tuple[str, str]) -> list[Finding]:
    """What the node agent's facts say against the node's declarations: a declared
    per-mille that overstated the swap, and swap the kubelet does not give (NoSwap)."""
    findings = []
    key, value = swap_label
    for node in sorted(nodes, key=_name):
        name = _name(node)
        labels = _labels(node)
        facts = NodeFacts.of(node)
        if facts is not None and facts.declared_permille is not None \
                and facts.permille is not None and facts.declared_permille > facts.permille:
            findings.append(Finding(
                "node-permille-overstated", None, f"Node/{name}",
                f"was declared {PERMILLE_LABEL}={facts.declared_permille} (NodePool, node "
                f"group template or --node-labels) but its swap gives {facts.permille}: the "
                "node agent replaced the label, and pods placed on the declared value before "
                "that may not be backed (see reshaped-pod-not-backed); fix the declaration "
                "where the node was made, every new node repeats it (docs/autoscaling.md)",
                details={"declaredPermille": facts.declared_permille,
                         "measuredPermille": facts.permille,
                         "label": labels.get(PERMILLE_LABEL)},
            ))
        capacity = swap_capacity(node)
        if capacity and swap_behavior(node) == NO_SWAP:
            labelled = labels.get(key) == value
            findings.append(Finding(
                "node-swap-noswap", None, f"Node/{name}",
                f"reports swap capacity {_size(capacity)} but its kubelet runs swapBehavior "
                "NoSwap: no pod gets swap there (on AKS the kubelet cannot be given "
                "LimitedSwap today, Azure/AKS#4352); "
                + (f"yet it is labelled {key}={value}, so reshaped pods are placed there and "
                   "get none: remove the label or run LimitedSwap" if labelled else
                   "reshaped pods are not placed there; run LimitedSwap if it should take "
                   "them (docs/node-setup.md)"),
                action=labelled,
                details={"swapCapacity": capacity, "labelled": labelled},
            ))
    return findings
