"""Resize-policy calculator.

The kubelet refuses an in-place memory resize of a container that uses swap unless its
memory ``resizePolicy`` is ``RestartContainer``; setting it up front keeps VPA-style
resizes working. The API server rejects ``RestartContainer`` on plain init containers
and in pods with ``restartPolicy: Never``, so those are never touched.
"""

from __future__ import annotations

from webhook.engine.pod import PodView, as_dict, as_list, as_str
from webhook.engine.pointer import PatchOp, add, replace
from webhook.engine.resources import ContainerChange
from webhook.engine.warnings import warning
from webhook.profile import Profile

RESTART = "RestartContainer"


def resize_ops(
    view: PodView, changes: list[ContainerChange], profile: Profile
) -> tuple[list[PatchOp], list[str]]:
    if profile.resize_policy != RESTART or view.spec.get("restartPolicy") == "Never":
        return [], []
    ops: list[PatchOp] = []
    warnings: list[str] = []
    for change in changes:
        container = change.container
        if container.kind == "init":
            continue
        path = container.path + "/resizePolicy"
        policies = container.raw.get("resizePolicy")
        entry = {"resourceName": "memory", "restartPolicy": RESTART}
        if policies is None:  # nearly always
            ops.append(add(path, [entry]))
            continue
        policies = as_list(policies, path)
        for index, policy in enumerate(policies):
            policy = as_dict(policy, path)
            if as_str(policy.get("resourceName"), f"{path}[].resourceName") != "memory":
                continue
            current = as_str(policy.get("restartPolicy"), f"{path}[].restartPolicy")
            if current != RESTART:
                ops.append(replace(f"{path}/{index}/restartPolicy", RESTART))
                warnings.append(
                    warning(
                        f"{container.name} memory resizePolicy "
                        f"{current} -> {RESTART} (required with swap)"
                    )
                )
            break
        else:
            ops.append(add(f"{path}/-", entry) if policies else add(path, [entry]))
    return ops, warnings
