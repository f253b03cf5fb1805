"""The Kubernetes driver: the only package that imports the official `kubernetes` client.

Entry point: `nodepool_k8s.driver.kubernetes.provider.KubernetesProvider` (imported lazily by
`driver.registry`). See doc/kubernetes-driver.md. Nothing is imported here, so importing the
package never loads the client.
"""
