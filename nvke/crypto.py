"""Secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256, from the ``cryptography`` package) with
key rotation through MultiFernet.

Keys come from ``NVKE_SECRET_KEYS``: comma-separated url-safe base64 Fernet keys, newest first
(``python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"``).
Encryption always uses the newest key; decryption tries each. After adding a new key in front,
``manage.py rotate_secrets`` re-encrypts every stored secret with it, then old keys can go.
Without ``NVKE_SECRET_KEYS`` (development only) one key is derived from ``SECRET_KEY``.
"""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


@lru_cache(maxsize=1)
def _fernet() -> MultiFernet:
    keys = [k.strip() for k in settings.NVKE_SECRET_KEYS if k.strip()]
    if not keys:
        derived = base64.urlsafe_b64encode(hashlib.sha256(settings.SECRET_KEY.encode()).digest())
        keys = [derived.decode()]
    return MultiFernet([Fernet(k.encode()) for k in keys])


def encrypt(plaintext: str) -> str:
    """Encrypt with the newest key; returns a Fernet token (text)."""
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    """Decrypt with any configured key. Raises ``cryptography.fernet.InvalidToken``."""
    return _fernet().decrypt(token.encode()).decode()


def rotate(token: str) -> str:
    """Re-encrypt a token with the newest key (MultiFernet.rotate)."""
    return _fernet().rotate(token.encode()).decode()


def reset_cache() -> None:
    """Forget the key ring (after changing ``NVKE_SECRET_KEYS`` in tests)."""
    _fernet.cache_clear()


__all__ = ["InvalidToken", "decrypt", "encrypt", "reset_cache", "rotate"]
