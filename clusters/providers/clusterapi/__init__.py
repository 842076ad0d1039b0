"""The ``clusterapi`` provider: Cluster API objects on a management cluster (see provider.py)."""

from __future__ import annotations

from .provider import ClusterApiProvider

__all__ = ["ClusterApiProvider"]
