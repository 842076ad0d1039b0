"""Querysets of node pool models: the one place that says which nodes are live."""

from __future__ import annotations

from django.db import models

from .choices import LIVE_NODE_PHASES


class NodeQuerySet(models.QuerySet):
    """``Node.objects`` (and ``pool.nodes``)."""

    def live(self) -> NodeQuerySet:
        """Nodes in a live phase (:data:`nodepools.choices.LIVE_NODE_PHASES`): not DELETING,
        not DELETED."""
        return self.filter(phase__in=LIVE_NODE_PHASES)
