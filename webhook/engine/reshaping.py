"""One reshape: the engine's decision on a pod, and the pod that decision gives.

Every caller goes through :func:`reshape`: the webhook (which sends only the patch),
``preview`` and ``plan`` (which show the pod after it), ``audit`` (which compares it with
the pod running). So the decision is made once per pod, in one place, and the pod after it
is always the patch applied, by the same JSON Patch rules the API server applies it with,
never a second rendering of the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import jsonpatch

from webhook.engine.mutate import Mutation, mutate_pod
from webhook.profile import Profile


@dataclass(frozen=True)
class Reshape:
    """``pod`` as given, the profile and the engine's :class:`Mutation` of it."""

    pod: Any  # what the caller was given: the engine refuses a malformed one itself
    profile: Profile
    mutation: Mutation
    # Offline callers know when a pod template belongs to a DaemonSet; None: from the pod.
    daemonset: bool | None = None

    @property
    def changed(self) -> bool:
        return bool(self.mutation.patch)

    @cached_property
    def after(self) -> Any:
        """The pod with the patch applied (a new object); the given pod when none."""
        if not self.mutation.patch:
            return self.pod
        return jsonpatch.apply_patch(self.pod, self.mutation.patch)


def reshape(pod: Any, profile: Profile, *, daemonset: bool | None = None) -> Reshape:
    """The engine's decision on ``pod`` under ``profile``; the pod after it on demand."""
    return Reshape(pod, profile, mutate_pod(pod, profile, daemonset=daemonset), daemonset)
