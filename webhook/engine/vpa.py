"""Pods a VerticalPodAutoscaler manages, as far as the pod itself tells.

The VPA admission controller is a mutating webhook of its own. Every pod it admits for a VPA
whose ``updateMode`` is not ``Off`` gets two annotations (VPA 1.x, ``pkg/admission-controller``):

- ``vpaObservedContainers``: the names of ``spec.containers``, joined by ``", "``;
- ``vpaUpdates``: ``Pod resources updated by <vpa>: container 0: cpu request, memory request,
  memory limit; container 1: `` - per container index, what it set.

They are the only trace of a VPA in an admission request, and they exist only once the VPA's
webhook has run: when swapwise is called first (webhooks run in the order of their
configurations' names), it sees them on its reinvocation. docs/vpa.md has the whole interplay.

A VPA never sets init containers. A container is taken as VPA-managed for memory unless the
VPA set resources on it and memory was not among them (``controlledResources: [cpu]``): with
no recommendation yet the VPA sets nothing, but will once it has one.
"""

from __future__ import annotations

from webhook.base.cel import cel_string
from webhook.engine.pod import PodView

OBSERVED_ANNOTATION = "vpaObservedContainers"
UPDATES_ANNOTATION = "vpaUpdates"
_SEPARATOR = ", "


def _updated(value: str) -> dict[int, list[str]]:
    """``vpaUpdates`` -> {container index: what the VPA set on it}; unreadable parts left out."""
    _, _, per_container = value.partition(": ")
    updated: dict[int, list[str]] = {}
    for part in per_container.split("; "):
        head, _, items = part.partition(": ")
        number = head.removeprefix("container ")
        if head.startswith("container ") and number.isdigit():
            updated[int(number)] = [item for item in items.split(_SEPARATOR) if item]
    return updated


def vpa_memory_containers(view: PodView) -> frozenset[str] | None:
    """Names of the containers whose memory a VPA manages; None when no VPA admitted the pod.

    An empty set: a VPA admitted the pod but sets only other resources (CPU) on it.
    """
    observed = view.annotations.get(OBSERVED_ANNOTATION)
    updates = view.annotations.get(UPDATES_ANNOTATION)
    if not isinstance(observed, str) and not isinstance(updates, str):
        return None
    regular = [c.name for c in view.containers if c.kind == "container"]
    names = set(regular)
    if isinstance(observed, str):
        names &= {name for name in observed.split(_SEPARATOR) if name}
    if isinstance(updates, str):
        for index, items in _updated(updates).items():
            if index < len(regular) and items and not any("memory" in i for i in items):
                names.discard(regular[index])
    return frozenset(names)


_CEL_ANNOTATIONS = "object.metadata.?annotations.orValue({})"


def cel_vpa_variables() -> list[tuple[str, str]]:
    """The same reading in CEL, for the rendered admission policies: (name, expression) of
    ``vpaOn`` (a VPA admitted the pod), ``vpaObserved`` (the observed names) and
    ``vpaDropped`` (indexes of the containers it set other resources on, not memory), with
    ``vpaParts`` between them (the per-container parts of ``vpaUpdates``)."""
    ann = _CEL_ANNOTATIONS
    observed, updates = cel_string(OBSERVED_ANNOTATION), cel_string(UPDATES_ANNOTATION)
    text = f"object.metadata.?annotations[?{updates}].orValue('')"
    return [
        ("vpaOn", f"{observed} in {ann} || {updates} in {ann}"),
        ("vpaObserved",
         f"object.metadata.?annotations[?{observed}].orValue('')"
         ".split(', ').filter(n, n != '')"),
        ("vpaParts",
         f"({text}.indexOf(': ') >= 0 ? {text}.substring({text}.indexOf(': ') + 2)"
         " : '').split('; ')"),
        ("vpaDropped",
         "variables.vpaParts.filter(p, p.matches('^container [0-9]+(: |$)') && "
         "p.indexOf(': ') >= 0 && p.substring(p.indexOf(': ') + 2).split(', ')"
         ".filter(x, x != '').size() > 0 && !p.substring(p.indexOf(': ') + 2)"
         ".split(', ').exists(x, x.contains('memory')))"
         ".map(p, int(p.substring(10).split(': ')[0]))"),
    ]


def cel_vpa_managed(index: str, name: str) -> str:
    """CEL: whether the regular container at ``index`` named ``name`` is VPA-managed for
    memory, as :func:`vpa_memory_containers` decides, from :func:`cel_vpa_variables`."""
    return (f"variables.vpaOn && ({cel_string(OBSERVED_ANNOTATION)} in {_CEL_ANNOTATIONS} ? "
            f"{name} in variables.vpaObserved : true) && "
            f"!variables.vpaDropped.exists(j, j == {index})")
