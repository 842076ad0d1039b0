"""Signals the catalog app defines.

``runnable_kubernetes_minors(sender)``: asked when the catalog lists Kubernetes versions.
Receivers in higher apps return the minors (``("1.36", "1.37")``) this installation can create
clusters of, or None when it can run any the catalog supports (the ``clusters`` app answers
for ``NVKE_DEFAULT_PROVIDER``, the provider of new clusters).
"""

from django.dispatch import Signal

runnable_kubernetes_minors = Signal()
