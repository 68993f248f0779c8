"""The pure mutation engine: pod + profile -> JSON Patch operations + warnings."""

from webhook.engine.mutate import Mutation, mutate_pod
from webhook.engine.reshaping import Reshape, reshape
from webhook.engine.resources import target

__all__ = ["Mutation", "Reshape", "mutate_pod", "reshape", "target"]
