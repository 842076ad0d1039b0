"""The driver each node pins, for placement's rule in :mod:`fleet.host_driver` (the driver is
the host's, one for every node on it).

:func:`node_pins` tells placement what driver each node holding GPUs pins
(:data:`fleet.host_driver.HOLDER_PINS`, registered by the app config).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from .models import Node


def node_pins(holder_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, str]:
    """``{node id: the driver it pins}`` ("" none) for the nodes among ``holder_ids``: the
    version the node booted with or was upgraded to (``Node.driver_version``, its pool's pin
    then). Placement reads it across tenants, as it reads GPUs."""
    return dict(Node.objects.filter(pk__in=list(holder_ids)).values_list("pk", "driver_version"))
