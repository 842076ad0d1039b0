"""Signals the reservations app sends to the apps above it (DESIGN §2).

``reservation_ending(sender, reservation)``: the reservation ends within its notice lead
(sent once, when ``announced_at`` is set, inside that transaction). Node pools set a
``ReservationEnding`` condition on the pools drawing from it; webhooks emit
``reservation.ending``.

``reservation_ended(sender, reservation)``: the end has come. Sent once with
``first=True`` (webhooks emit ``reservation.ended``), then on every sweep until settled:
receivers do what ``end_action`` says to the pools drawing from it and return the number of
pools still to settle (``int``); the reservation is settled when every receiver returns 0.
"""

from django.dispatch import Signal

reservation_ending = Signal()
reservation_ended = Signal()
