"""Moved to testkit/progress.py; kept for tests/node/ (see __init__.py)."""

from testkit.progress import uncaptured as uncaptured
