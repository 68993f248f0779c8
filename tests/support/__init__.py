"""The two test helpers tests/node/ still imports from here (a build's progress, the docs
runner), until the node agent's rewrite of those tests moves them beside the rest in
testkit/."""
