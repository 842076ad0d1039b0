"""A pool goes ERROR: the condition, its nodes' readiness and the operation FAILED, in one place."""

from __future__ import annotations

import logging
from datetime import datetime

from clusters.choices import Phase
from clusters.models import finish_operation
from nvke.conditions import set_condition

from .. import readiness
from ..models import NodePool

log = logging.getLogger(__name__)


def _fail(pool: NodePool, code: str, message: str, retryable: bool, now: datetime) -> None:
    log.warning("node pool %s (%s) goes ERROR: %s: %s", pool.id, pool.name, code, message)
    pool.phase = Phase.ERROR
    pool.observed_generation = pool.generation
    pool.conditions = set_condition(pool.conditions, "Ready", False, _reason(code), message, now)
    # NodesReady as the next steps read it (_step_failed): the nodes it has, those not placed
    live = list(pool.nodes.live().order_by("created_at", "name"))
    pool.conditions = set_condition(
        pool.conditions, *readiness.nodes_ready(readiness.readiness(pool, live)), now
    )
    pool.save(update_fields=["phase", "observed_generation", "conditions", "updated_at"])
    finish_operation(
        pool.id, error={"code": code, "message": message, "retryable": retryable}, now=now
    )
    return None


def _reason(code: str) -> str:
    return "".join(part.capitalize() for part in code.split("_"))
