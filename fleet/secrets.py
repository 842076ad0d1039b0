"""Agent secrets: random 256-bit tokens, stored as SHA-256 digests only."""

from __future__ import annotations

import hashlib
import secrets


def new_token() -> str:
    """A URL-safe random token (32 bytes of entropy) that never starts with ``-``: tokens are
    passed on command lines (``nvke-agent run --bootstrap-token TOKEN``), where a leading dash
    reads as an option (1 token in 64 did, before this)."""
    while True:
        token = secrets.token_urlsafe(32)
        if not token.startswith("-"):
            return token


def digest(token: str) -> str:
    """SHA-256 hex digest of a token (what the database keeps)."""
    return hashlib.sha256(token.encode()).hexdigest()
