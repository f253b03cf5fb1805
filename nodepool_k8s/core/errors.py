"""Domain errors shared by every layer.

Owns: the error taxonomy. Every failure that crosses a layer boundary is one of these, so
callers branch on type, never on message text. `TemporaryError` means "the same action may
succeed later" (retry with backoff); `PermanentError` means "retrying the same thing is
pointless" (fail or decline).
"""

from __future__ import annotations


class NodepoolError(Exception):
    """Base of all nodepool_k8s errors."""


class ConfigError(NodepoolError):
    """The configuration is invalid; the message names the file and the place."""

    def __init__(self, problems: list[str] | str, path: str | None = None) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        self.path = path
        where = f"{path}: " if path else ""
        super().__init__("\n".join(f"{where}{p}" for p in self.problems))


class TemporaryError(NodepoolError):
    """May succeed when retried; `delay` suggests how long to wait first (seconds)."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(NodepoolError):
    """Retrying the same action will not help."""


class DriverContractError(PermanentError):
    """A driver class does not keep the provider contract it declares (see
    `driver.registry.cluster_aware`): a programming error, found when the provider is
    registered; retrying cannot help until the driver is fixed."""


class NotFound(PermanentError):
    """The object does not exist (any more)."""


class NotOwned(PermanentError):
    """The resource a record names is not provably ours: it was not deleted, and never will be.

    Raised by `Provider.delete` before any destructive call when the object lacks our
    ownership labels (provider, installation, node). The message says why.
    """


class DeletionBlocked(TemporaryError):
    """A deletion is held up by something the provider tried and failed to remove (a
    namespace's leftover finalizers, say). The provider has logged it (once per resource);
    the caller retries with its back-off without logging it at WARNING again."""


class QuotaExceeded(TemporaryError):
    """The cloud refused for lack of quota; capacity may free up later."""


class ProviderUnavailable(TemporaryError):
    """The provider as a whole cannot act now, whatever the label or request: the cloud
    refuses its credentials, say. Not a failed launch: the core keeps the request waiting
    (the node is aborted, as for quota), counts nothing against the label, and tries again
    later while the driver works on getting its credentials accepted. `reason` is one of
    `conditions.REASONS`.
    """

    def __init__(self, message: str, reason: str = "ApiError",
                 delay: float | None = None) -> None:
        super().__init__(message, delay=delay)
        self.reason = reason


class LaunchError(NodepoolError):
    """A node launch attempt failed. `reason`: a code of `core.conditions.REASONS` (the core
    writes any other value as `Unknown`), never an exception's class name."""

    def __init__(self, message: str, reason: str = "LaunchFailed",
                 retryable: bool = True) -> None:
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable


class LaunchCancelled(LaunchError):
    """The core gave up on the launch (its cancel event was set, or the provider stopped)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="Cancelled")


class BootTimeout(LaunchError):
    """The node did not become usable before its boot timeout."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="BootTimeout")


class ZkSessionLost(TemporaryError):
    """The ZooKeeper session was suspended or lost; stop acting until it is back."""


class LockNotAcquired(TemporaryError):
    """Someone else holds the lock (or it could not be taken in time)."""
