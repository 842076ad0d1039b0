"""Signals the nodepools app sends (DESIGN §2); billing connects to them.

``node_ready(sender, node)``: a node became READY and holds its GPUs from ``node.ready_at``.
``node_released(sender, node)``: a node gave its GPUs back at ``node.released_at``.
Both are sent inside the reconciler's transaction, so receivers' writes commit with it.
"""

from django.dispatch import Signal

node_ready = Signal()
node_released = Signal()

# ``node_repaired(sender, node, action, reason)``: auto-repair finished with a node:
# ``action`` "reboot" (the node is READY again on the same GPUs) or "replace" (released; a new
# node is placed on healthy GPUs). Sent inside the reconciler's transaction (send_robust).
node_repaired = Signal()

# ``price_nodepool(sender, tenant_id, gpu_model, gpus, reservation)``: a dry run asks what a
# pool holding ``gpus`` whole GPUs would cost per hour. Billing answers ``{"currency",
# "unit_price", "gpus", "hourly", "basis": "on-demand" | "reservation", ...}``, or
# ``{"cost_error": {"code": "missing_price", "gpu_model", "mig_profile", "currency", ...}}``.
price_nodepool = Signal()

# ``disruption_requested(sender, request)``: a planned disruption of ``request.nodes`` asks the
# tenant for a checkpoint (``request``: a :class:`nodepools.models.DisruptionRequest`). Sent
# inside the transaction that writes the request (send_robust), so the webhook delivery row
# commits with it (:mod:`nodepools.checkpoints`).
disruption_requested = Signal()
