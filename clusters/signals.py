"""Signals the clusters app sends to the apps above it (DESIGN §2).

``cluster_deleting(sender, cluster)``: sent by the cluster reconciler on every step of a
deletion. Receivers (node pools) start removing what they own and return how many of their
objects still exist (``int``), or a list of names that could not be removed
(``list[str]``, which ends the deletion as ``DELETE_FAILED``).
"""

from django.dispatch import Signal

cluster_deleting = Signal()
