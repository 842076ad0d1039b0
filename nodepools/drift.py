"""Drift: a READY node whose host's latest report stops matching what the node must run (the
host reports MIG on under an exclusive node, another driver, a GPU gone from its inventory) is
never silently left as it was (DESIGN §3, "Observed state gates transitions").

What the tenant's scheduler sees follows the host by itself: the Node's allocatable and GFD
labels are derived from the latest report (:mod:`nodepools.tenant_nodes`; ``mig.config.state``
turns ``pending``). What the pool and the operator see is written here, at every reconcile
step of a pool that is not changing the node (:func:`check_drift`), with the same comparison
as the observed-state gate (:func:`nodepools.observed_gates.differences`: "expected X, reported Y"):

* the pool's condition ``NodesDrifted``: True (reason ``ObservedStateDrift``) naming each
  drifted node and every difference, False (``NoDrift``) once every host agrees again;
* the host warning of the gate's kind (``observed state: node <name> drifted from its pool:
  …``, :data:`fleet.host_warnings.OBSERVED_STATE`), cleared once the host agrees.

The node stays READY (its pods keep running; repair decides about broken GPUs, an operator
about the rest). Nodes being changed — drained, reconfigured, upgraded, repaired, moved — are
the gate's to judge, not this check's: it skips them, and a node whose applied config is not
the pool's (an isolation change rolling) too.
"""

from __future__ import annotations

from datetime import datetime

from fleet.agent_facts import host_facts
from fleet.host_warnings import OBSERVED_STATE, set_host_warning
from nvke.conditions import save_conditions

from . import observed_gates
from .choices import NodePhase
from .gpu_config import config_hash
from .models import Node, NodePool

CONDITION = "NodesDrifted"


def steady(node: Node, desired_config: str) -> bool:
    """A READY node nobody is changing, running the pool's current config."""
    return (
        node.phase == NodePhase.READY
        and not node.disruption
        and node.applied_config in ("", desired_config)
    )


def node_drift(pool: NodePool, node: Node) -> list[str]:
    """What ``node``'s host reports differently from what the node must run (its pool's GPU
    config and the node's own driver); empty when they agree."""
    facts = host_facts(node.host_id, node.gpu_uuids) if node.host_id else None
    expected = observed_gates.expectation(pool, driver=node.driver_version or pool.driver_version)
    return observed_gates.differences(node, expected, facts, after=None)


def check_drift(pool: NodePool, live: list[Node], now: datetime) -> list[str]:
    """Compare each steady node of ``live`` with its host's latest report; write the pool's
    ``NodesDrifted`` condition and the hosts' warnings (see module doc). Returns one text per
    drifted node (``"node N: <gpu>: MIG mode expected disabled, reported enabled"``)."""
    desired = config_hash(pool.gpu_config)
    drifted = []
    for node in live:
        # a node made READY at this step passed the gate a moment ago, on the same report and
        # in the same transaction: comparing it again would read the same facts twice
        if not steady(node, desired) or node.ready_at == now:
            continue
        problems = node_drift(pool, node)
        prefix = f"{OBSERVED_STATE}{node.name} "
        if problems:
            drifted.append(f"node {node.name}: " + "; ".join(problems))
        if node.host_id:
            text = f"{prefix}drifted from its pool: {'; '.join(problems)}" if problems else None
            set_host_warning(node.host_id, prefix, text)
    if drifted:
        message = "; ".join(drifted)[:1000]
        save_conditions(pool, now, (CONDITION, True, "ObservedStateDrift", message))
    elif any(c.get("type") == CONDITION for c in pool.conditions):
        save_conditions(
            pool, now, (CONDITION, False, "NoDrift", "every node's host reports what it must run")
        )
    return drifted
