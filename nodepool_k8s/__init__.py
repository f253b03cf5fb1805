"""nodepool_k8s: a Nodepool-compatible launcher for ephemeral Kubernetes namespaces and pods."""

__version__ = "0.1.0"
