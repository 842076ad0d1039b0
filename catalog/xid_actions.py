"""The one Xid-action table: what each NVIDIA resolution bucket takes out of service.

NVIDIA's Xid catalog gives every Xid a "Resolution Bucket (Immediate Action)" (``RESET_GPU``,
``RESTART_BM`` …; ``catalog/data/xid.yaml``, an unchanged copy of the shared catalog, keeps it
per code). This table adds NVKE's **scope** of each bucket, read by both sides that need it:

* ``fleet`` (:mod:`fleet.health`): a ``host``-scoped action cordons the host;
* ``billing`` (:mod:`billing.health`): an SLA credit covers every allocation on the host
  (``host``), the node(s) holding the GPU (``node``) or the GPU's own rows (``gpu``).

Scopes:

* ``gpu`` — the GPU alone (a GPU reset, an application restart, a vendor case on that GPU).
* ``node`` — ``RESTART_VM``: NVIDIA's bucket names tell a virtual machine (``RESTART_VM``) from
  bare metal (``RESTART_BM``); the catalog's own text is "restart the VM hosting the GPU"
  (``xid.yaml`` ``resolution_buckets_to_nvke``). In NVKE a VM is one tenant node (a shared
  host's tenant nodes are VMs: :class:`fleet.choices.HostTenancy`), so restarting it takes down
  that node, not the hypervisor host and the other tenants' VMs on it: the host is not
  cordoned (fleet used to treat it as ``host``) and the credit covers the node (as billing did).
* ``host`` — ``RESTART_BM`` (restart the bare-metal machine) and ``CHECK_MECHANICALS`` (power
  cabling, seating: a hardware ticket for the machine).

Buckets not listed (``IGNORE``, ``WORKFLOW_*``, an Xid NVKE does not know …) are ``gpu``.
Source: https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html (bucket names).
"""

from __future__ import annotations

from typing import Literal

Scope = Literal["gpu", "node", "host"]

#: NVIDIA immediate action -> scope; anything else is ``gpu``
ACTION_SCOPES: dict[str, Scope] = {
    "IGNORE": "gpu",
    "RESTART_APP": "gpu",
    "RESET_GPU": "gpu",
    "CONTACT_SUPPORT": "gpu",
    "UPDATE_SWFW": "gpu",
    "CHECK_UVM": "gpu",
    "XID_154": "gpu",
    "RESTART_VM": "node",
    "RESTART_BM": "host",
    "CHECK_MECHANICALS": "host",
}
SCOPES: tuple[Scope, ...] = ("gpu", "node", "host")


def action_scope(action: str) -> Scope:
    """The scope (``gpu`` | ``node`` | ``host``) of an NVIDIA immediate action (``gpu`` for an
    action the table does not list, including ``""``)."""
    return ACTION_SCOPES.get(action, "gpu")


def actions_of_scope(scope: Scope) -> tuple[str, ...]:
    """The actions listed with ``scope``, sorted (for SQL ``= ANY(...)`` filters)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}: {scope!r}")
    return tuple(sorted(a for a, s in ACTION_SCOPES.items() if s == scope))
