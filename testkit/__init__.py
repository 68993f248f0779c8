"""Helpers of the tests and the benchmarks (not tests themselves): pods and reviews, what
kube-apiserver sends (payloads), a server process, an in-process ASGI client, the engine
check, Hypothesis strategies, the golden recording of the admission policies.

tests/ and benchmarks/ both import this package, and it imports neither: so tests/ never
imports benchmarks/ (whose own tests are benchmarks/tests/). The benchmarks' API-server run
still takes the e2e control plane from tests/e2e/cluster.py, which is to move here once the
node side's tests, which import it too, are rewritten.
"""
