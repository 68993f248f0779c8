"""The memory-pressure mark: the names the engine, ``label-nodes`` and ``audit`` share.

``swapwise label-nodes --pressure-guard`` puts ``PRESSURE_LABEL: "true"`` on a swap node
whose memory pressure (PSI) stays high, and removes it when the pressure stays low; the
webhook adds ``{key: PRESSURE_LABEL, operator: DoesNotExist}`` to every required
nodeSelectorTerm of a pod it reshapes, so new reshaped pods are not placed on a marked node
(nothing else is affected, nothing is evicted). ``PRESSURE_ANNOTATION`` on the node says
why it was last marked or cleared, with the figures.
"""

from __future__ import annotations

PRESSURE_LABEL = "swapwise.io/memory-pressure"
PRESSURE_VALUE = "true"
PRESSURE_ANNOTATION = "swapwise.io/memory-pressure"
