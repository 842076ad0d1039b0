"""Which telemetry samples describe a ledger row — the one rule both utilization reports use.

A whole-GPU row (``mig_gpu_instance_id`` null) reads the whole-GPU samples; a MIG GPU
instance's row reads the samples of that instance only. A shared GPU's whole-GPU samples
include the co-tenants' memory and activity: reading them for an instance showed tenant B its
neighbour's memory use as its own headroom (issue 26). In SQL, ``s`` is ``fleet_gpusample``.
"""

from __future__ import annotations


def samples_of(ledger_alias: str) -> str:
    """The join condition between ``fleet_gpusample s`` and the ledger rows ``ledger_alias``."""
    return (
        f"s.gpu_uuid = {ledger_alias}.gpu_uuid"
        f" AND s.mig_gpu_instance_id IS NOT DISTINCT FROM {ledger_alias}.mig_gpu_instance_id"
    )
