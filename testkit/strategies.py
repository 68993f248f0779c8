"""Hypothesis strategies for pods and profiles shaped like real workloads."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from webhook.policy import build_policy
from webhook.profile import Profile

SWAP = "swapwise.io/swap-node"

memory = st.one_of(
    st.integers(1, 64).map(lambda n: f"{n * 128}Mi"),
    st.integers(1, 16).map(lambda n: f"{n}Gi"),
    st.integers(1, 8).map(lambda n: f"{n}G"),
    st.integers(10**6, 10**10).map(str),
    st.sampled_from(["1.5Gi", "2e9", "1536Mi", "0.5Gi", "16Mi", "1Mi", "100M", "750Ki"]),
)
cpu = st.sampled_from(["100m", "250m", "1", "2", "0.5"])


@st.composite
def resources(draw: st.DrawFn) -> dict[str, Any] | None:
    shape = draw(st.sampled_from(["guaranteed", "limit", "burstable", "request", "none", "cpu"]))
    mem = draw(memory)
    c = draw(cpu)
    if shape == "guaranteed":
        return {"requests": {"memory": mem, "cpu": c}, "limits": {"memory": mem, "cpu": c}}
    if shape == "limit":
        return {"limits": {"memory": mem}}
    if shape == "burstable":
        return {"requests": {"memory": "64Mi"}, "limits": {"memory": mem, "cpu": c}}
    if shape == "request":
        return {"requests": {"memory": mem}}
    if shape == "cpu":
        return {"requests": {"cpu": c}}
    return draw(st.sampled_from([None, {}]))


@st.composite
def container(draw: st.DrawFn, name: str, init: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {"name": name, "image": "img"}
    res = draw(resources())
    if res is not None:
        result["resources"] = res
    if init and draw(st.booleans()):
        result["restartPolicy"] = "Always"
    if draw(st.integers(0, 4)) == 0:
        result["resizePolicy"] = draw(st.sampled_from([
            [{"resourceName": "cpu", "restartPolicy": "NotRequired"}],
            [{"resourceName": "memory", "restartPolicy": "NotRequired"}],
            [{"resourceName": "memory", "restartPolicy": "RestartContainer"}],
        ]))
    return result


PERMILLE = "swapwise.io/swap-permille"
PRESSURE = "swapwise.io/memory-pressure"
CPU_PRESSURE = "swapwise.io/cpu-pressure"

expression = st.one_of(
    st.fixed_dictionaries({
        "key": st.sampled_from(["zone", SWAP, "pool"]),
        "operator": st.just("In"),
        "values": st.lists(st.sampled_from(["a", "b", "true"]), min_size=1, max_size=2),
    }),
    # the swap-backing key: earlier swapwise entries below, at and above a pod's need, and
    # entries that are the user's (another operator)
    st.fixed_dictionaries({
        "key": st.just(PERMILLE),
        "operator": st.just("Gt"),
        "values": st.sampled_from(["0", "999", "1998", "1999", "2000", "0002000", "99999"])
        .map(lambda v: [v]),
    }),
    st.fixed_dictionaries({
        "key": st.just(PERMILLE),
        "operator": st.sampled_from(["In", "NotIn", "Lt"]),
        "values": st.sampled_from([["1500"], ["5000"]]),
    }),
    # the pressure keys: swapwise's own entry (DoesNotExist) and the user's (the rest)
    st.fixed_dictionaries({
        "key": st.sampled_from([PRESSURE, CPU_PRESSURE]),
        "operator": st.sampled_from(["DoesNotExist", "DoesNotExist", "Exists"]),
    }),
    st.fixed_dictionaries({
        "key": st.sampled_from([PRESSURE, CPU_PRESSURE]),
        "operator": st.sampled_from(["In", "NotIn"]),
        "values": st.just(["true"]),
    }),
)

required_affinity = st.builds(
    lambda terms: {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": terms}}},
    st.lists(st.one_of(
        st.builds(lambda e: {"matchExpressions": e}, st.lists(expression, max_size=3)),
        st.just({"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": ["n1"]}]}),
    ), min_size=1, max_size=3))

affinity = st.one_of(
    st.none(),
    required_affinity,
    st.builds(lambda e: {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": e}}]}}, st.lists(expression, max_size=2)),
    st.just({"podAntiAffinity": {}}),
)

toleration = st.fixed_dictionaries(
    {"key": st.sampled_from(["swap", "gpu"]), "effect": st.sampled_from(["NoSchedule", ""])},
    optional={"operator": st.sampled_from(["Equal", "Exists"]), "value": st.just("true")},
).filter(lambda t: not (t.get("operator") == "Exists" and "value" in t))


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 4))
    m = draw(st.integers(0, 2))
    spec: dict[str, Any] = {"containers": [draw(container(f"c{i}")) for i in range(n)]}
    if m:
        spec["initContainers"] = [draw(container(f"i{i}", init=True)) for i in range(m)]
    for key, strategy in [
        ("restartPolicy", st.sampled_from(["Always", "OnFailure", "Never"])),
        ("affinity", affinity),
        ("tolerations", st.lists(toleration, max_size=2)),
        ("nodeName", st.just("node-1")),
        ("priority", st.sampled_from([0, 1000, 2_000_000_000])),
        ("priorityClassName", st.sampled_from(["high", "system-node-critical"])),
        ("os", st.sampled_from([{"name": "linux"}, {"name": "windows"}])),
    ]:
        if draw(st.integers(0, 3)) == 0:
            spec[key] = draw(strategy)
    metadata: dict[str, Any] = {"name": "p"}
    if draw(st.booleans()):
        metadata["labels"] = draw(st.dictionaries(
            st.sampled_from(["app", "swapwise.io/skip", "tier"]),
            st.sampled_from(["true", "false", "web"]), max_size=2))
    if draw(st.booleans()):
        metadata["annotations"] = draw(st.dictionaries(
            st.sampled_from(["a/b~c", "swapwise.io/profile", "note"]),
            st.sampled_from(["x", "sandbox"]), max_size=2))
    if draw(st.integers(0, 3)) == 0:  # admitted by a VPA's webhook (docs/vpa.md)
        sets = st.sampled_from(["", "memory request, memory limit", "cpu request",
                                "cpu request, memory request"])
        updates = "; ".join(f"container {i}: {draw(sets)}" for i in range(n))
        metadata["annotations"] = {
            **metadata.get("annotations", {}),
            "vpaObservedContainers": ", ".join(f"c{i}" for i in range(n)),
            "vpaUpdates": f"Pod resources updated by v: {updates}",
        }
    if draw(st.integers(0, 5)) == 0:
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                                        "name": "ds", "uid": "u"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    fields: dict[str, Any] = {}
    if draw(st.booleans()):
        fields["swapRatio"] = draw(st.sampled_from([0.5, 1, 2, 3, 10]))
    else:
        fields["requestRatio"] = draw(st.sampled_from([0.1, 0.25, 0.33, 0.5, 0.9]))
    fields["minRequest"] = draw(st.sampled_from(["16Mi", "64Mi", "100M", "1Mi"]))
    if draw(st.booleans()):
        fields["maxLimitRequestRatio"] = draw(st.sampled_from([1.5, 2, 8]))
    if draw(st.booleans()):
        fields["defaultLimit"] = draw(st.sampled_from(["1Gi", "2Gi", "512Mi"]))
    fields["guaranteedPods"] = draw(st.sampled_from(["convert", "skip"]))
    fields["vpaPods"] = draw(st.sampled_from(["skip", "raiseLimit"]))
    fields["resizePolicy"] = draw(st.sampled_from(["RestartContainer", "keep"]))
    fields["placement"] = {
        "mode": draw(st.sampled_from(["required", "preferred", "none"])),
        "tolerations": draw(st.lists(toleration, max_size=2, unique_by=str)),
    }
    if draw(st.integers(0, 4)) == 0:
        fields["placement"]["swapBacking"] = "off"
    selector = draw(st.integers(0, 5))
    if selector < 2:
        fields["placement"]["nodeSelector"] = {SWAP: "true", "pool": "swap"}
    elif selector == 2:
        fields["placement"]["nodeSelector"] = {}
    policy = build_policy({"apiVersion": "swapwise.io/v1alpha1", "kind": "SwapPolicy",
                           "profiles": {"prop": fields}})
    return policy.profiles["prop"]
