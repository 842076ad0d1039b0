"""The mail backend of a production process without ``EMAIL_URL``: it sends nothing.

Mail carries password-reset links; printing it to the log (Django's console backend, the old
default) let anyone who reads the pod log take over accounts. Such a process only starts with
``NVKE_ALLOW_INSECURE_DEFAULTS=1`` (``nvke/secrets_check.py``, check ``nvke.E005``); each mail
it drops is a WARNING naming how many recipients, never the message.
"""

from __future__ import annotations

import structlog
from django.core.mail.backends.base import BaseEmailBackend

log = structlog.get_logger(__name__)


class UnconfiguredEmailBackend(BaseEmailBackend):
    def send_messages(self, email_messages) -> int:
        for message in email_messages:
            log.warning(
                "mail_not_sent",
                reason="EMAIL_URL is not set",
                recipients=len(message.recipients()),
            )
        return 0
