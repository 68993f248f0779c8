"""swapwise: a mutating admission webhook that reshapes pods for Kubernetes node swap."""

__version__ = "0.1.0"
