"""Moved to testkit/docs.py; kept for tests/node/ (see __init__.py)."""

from testkit.docs import load as load
