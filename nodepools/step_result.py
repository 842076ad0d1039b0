"""What a reconcile step answers, typed (Cluster API's ``ctrl.Result``), instead of the float
sentinels the steps used to share (``-1.0`` for stop twice, ``-2.0`` for "runs short").

A sub-step (scale-up, host moves, repair, isolation change, upgrade) returns:

- ``None``: nothing to do here, the next sub-step runs (continue);
- a float: requeue the pool after that many seconds;
- :data:`STOP`: the pool waits for an outside change (a paused rollout, every move blocked,
  an operator) — no requeue, the beat resync and the change's own signal wake it;
- :data:`SHORT`: only from a scale-up that found no capacity for replacements; the caller
  lets the pool run short and carries on;
- :data:`GROW_SHORT`: only from a scale-up of a serving pool that found no capacity for its
  new nodes; the pool serves the nodes it has (condition ``CapacityShort``) and retries.

:func:`delay_of` turns any of them into what the Celery task needs (seconds or None).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Step:
    """A step result that is not a plain requeue delay (see the module docstring)."""

    kind: str

    def __repr__(self) -> str:
        return f"Step.{self.kind}"


#: the pool waits for an outside change: no requeue
STOP = Step("stop")
#: a scale-up found no capacity for replacements: the pool runs short, the step goes on
SHORT = Step("short")
#: a serving pool's scale-up found no capacity: it serves what it has and retries
GROW_SHORT = Step("grow-short")

#: what a sub-step returns: continue (None), requeue after N s (float), STOP, SHORT or
#: GROW_SHORT
StepResult = float | Step | None


def delay_of(result: StepResult) -> float | None:
    """The requeue delay (s) for the task: None for continue/STOP, the float otherwise."""
    if isinstance(result, Step):
        if result in (SHORT, GROW_SHORT):
            raise ValueError(f"{result!r} is a scale-up's answer to its caller, not a step's end")
        return None
    return result
