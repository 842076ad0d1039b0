"""Signals the clusters app sends to the apps above it (DESIGN §2).

``cluster_deleting(sender, cluster)``: sent by the cluster reconciler on every step of a
deletion. Receivers (node pools) start removing what they own and return how many of their
objects still exist (``int``), or a list of names that could not be removed
(``list[str]``, which ends the deletion as ``DELETE_FAILED``).
"""

from django.dispatch import Signal

cluster_deleting = Signal()

# ``collect_node_versions(sender, cluster)``: receivers return the Kubernetes versions their
# live node pools run (``list[tuple[str, str]]`` of ``(pool name, version)``), so a control
# plane upgrade can refuse to leave nodes outside the supported skew.
collect_node_versions = Signal()

# ``operation_cancelled(sender, operation)``: the owner of the operation's target rolls its
# spec back to what is observed (e.g. a pool's node_count to its live nodes) and returns True,
# or returns False when that kind of operation cannot be cancelled.
operation_cancelled = Signal()

# ``operation_finished(sender, operation_id)``: an operation ended DONE or FAILED; sent once the
# change committed (``transaction.on_commit``). Webhooks turn it into ``operation.finished`` /
# ``operation.failed`` events.
operation_finished = Signal()
