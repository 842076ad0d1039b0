"""Agent secrets: random 256-bit tokens, stored as SHA-256 digests only."""

from __future__ import annotations

import hashlib
import secrets


def new_token() -> str:
    """A URL-safe random token (32 bytes of entropy)."""
    return secrets.token_urlsafe(32)


def digest(token: str) -> str:
    """SHA-256 hex digest of a token (what the database keeps)."""
    return hashlib.sha256(token.encode()).hexdigest()
