"""What tests/node/ still imports from here, until the node agent's rewrite of those tests:
the helpers themselves live in testkit/ (delete this package with that rewrite)."""
