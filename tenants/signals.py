"""Signals the tenants app defines.

``collect_usage(sender, tenant_id)``: asked when quota usage is shown. Receivers in higher apps
return a dict with any of ``{"clusters": int, "nodes": int, "gpus": {slug: int}}`` describing
what the tenant actually holds now (running clusters, READY nodes, GPUs held).
"""

from django.dispatch import Signal

collect_usage = Signal()
