"""One definition of a *placeable* GPU, for placement, dry runs, fragmentation and the console.

A GPU is placeable when a new node could get it now: nobody holds it, its health is HEALTHY
(an UNHEALTHY GPU, after an Xid or a failed check, is not), its scrub state is CLEAN, its
host's agent still lists it (``missing_since`` is null) and its host is schedulable
(``AVAILABLE``/``ALLOCATED``: a host whose agent went silent is ``NOT_READY``, its GPUs'
state unknown). A GPU on a *shared* host (``tenancy: shared``) is placeable only for MIG
instances of shared pools (:mod:`fleet.shared_hosts`), never for a dedicated shape.

Two forms of the same rule: :func:`placeable_gpus_q` for ORM queries (console overview, the
node pool form) and the ``usable`` column of :data:`fleet.placement._VIEWS_SQL` with
:attr:`fleet.placement.HostView.schedulable` (False for shared hosts) for the planner and the
fragmentation report; ``tests/fleet/test_placeable.py`` checks that they agree.
"""

from __future__ import annotations

from django.db.models import Q

from .choices import SCHEDULABLE_HOST_STATES, GpuHealth, HostTenancy, ScrubState


def placeable_gpus_q(*, shared_hosts: bool = False, prefix: str = "") -> Q:
    """The ORM filter of placeable GPUs (``Gpu`` rows; ``prefix`` e.g. ``"gpus__"`` from
    ``Host``). ``shared_hosts``: count GPUs of shared hosts too (capacity for MIG instances of
    shared pools); default: dedicated hosts only (whole-GPU and dedicated MIG shapes)."""
    q = Q(
        **{
            f"{prefix}holder_id__isnull": True,
            f"{prefix}health": GpuHealth.HEALTHY,
            f"{prefix}scrub_state": ScrubState.CLEAN,
            f"{prefix}missing_since__isnull": True,
            f"{prefix}host__state__in": SCHEDULABLE_HOST_STATES,
        }
    )
    if not shared_hosts:
        q &= Q(**{f"{prefix}host__tenancy": HostTenancy.DEDICATED})
    return q
