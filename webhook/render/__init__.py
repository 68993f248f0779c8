"""Renderers: the policy file turned into other Kubernetes objects (no I/O here)."""
