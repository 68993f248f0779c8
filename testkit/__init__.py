"""Helpers shared by the tests (not tests themselves): pods and reviews, a server process,
the engine check, the docs runner, Hypothesis strategies."""
