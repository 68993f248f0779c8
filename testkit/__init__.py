"""Helpers shared by the tests and the benchmarks (not tests themselves): pods and reviews,
what kube-apiserver sends (payloads), a server process, an in-process ASGI client, the
engine check, the docs runner, Hypothesis strategies.

tests/ and benchmarks/ both import this package; it imports neither, and neither imports
the other (benchmarks/tests/ holds the benchmarks' own tests)."""
