"""Signals billing sends to the apps above it (DESIGN §2).

``invoice_finalized(sender, invoice)``: an invoice went ``DRAFT -> FINALIZED``; sent inside the
finalizing transaction, so receivers' writes commit with it (webhooks: ``invoice.finalized``).
"""

from django.dispatch import Signal

invoice_finalized = Signal()
