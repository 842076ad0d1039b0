"""Provider registry: ``get_provider(name)``."""

from __future__ import annotations

from .base import Provider, ProviderError

#: providers whose infrastructure replaces machines by itself (Cluster API's health checks):
#: the periodic resync looks at their RUNNING pools (``Provider.replaced_machines``)
MACHINE_REPLACING_PROVIDERS = ("clusterapi",)


def get_provider(name: str) -> Provider:
    """The provider called ``name``; raises ProviderError (not retryable) for an unknown one."""
    if name == "simulated":
        from .simulated import SimulatedProvider

        return SimulatedProvider()
    if name == "hosted":
        from .hosted import HostedProvider

        return HostedProvider()
    if name == "clusterapi":
        from .clusterapi import ClusterApiProvider

        return ClusterApiProvider()
    raise ProviderError(f"unknown provider {name!r}", retryable=False, code="unknown_provider")


__all__ = ["MACHINE_REPLACING_PROVIDERS", "Provider", "ProviderError", "get_provider"]
