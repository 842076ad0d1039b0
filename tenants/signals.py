"""Signals the tenants app defines.

``collect_usage(sender, tenant_id)``: asked when quota usage is shown. Receivers in higher apps
return a dict with any of ``{"clusters": int, "nodes": int, "gpus": {slug: int}}`` describing
what the tenant actually holds now (running clusters, READY nodes, GPUs held).
"""

from django.dispatch import Signal

collect_usage = Signal()

# ``quota_threshold_reached(sender, tenant_id, resource, limit, reserved, threshold)``: a
# reservation took ``resource`` ("clusters", "nodes", "gpus.<slug>") from below ``threshold``
# percent (80 or 100) of ``limit`` to at or above it. Sent once the reservation committed.
quota_threshold_reached = Signal()
